"""PULSELoCo: the BF16-visibility gate, error feedback, outer step, payloads and configs."""

from __future__ import annotations

import pytest
import torch

from workers.pulse.loco.codec import PayloadError, decode_dense, decode_sparse, encode_dense, encode_sparse, layout_hash
from workers.pulse.loco.launch import LocoRunConfig
from workers.pulse.loco.maths import (
    OuterConfig,
    SparseUpdate,
    average_sparse,
    flatten,
    gate_pseudo_gradient,
    outer_step,
    restore_error,
    unflatten_into,
)
from workers.pulse.loco.tasks import TaskConfig
from workers.pulse.loco.transport import ExchangeConfig

HALF_ULP_AT_1_5 = 2.0**-8
"""BF16 keeps 8 significant bits: values in [1, 2) are 2**-7 apart, so half a ULP is 2**-8."""


def test_entry_below_half_a_bf16_ulp_is_held_back_then_sent_once_visible():
    global_N = torch.tensor([1.5, 1.5])
    small, large = 0.75 * HALF_ULP_AT_1_5, 1.5 * HALF_ULP_AT_1_5
    local_N = global_N - torch.tensor([small, large])
    error_N = torch.zeros(2)

    update, error_N = gate_pseudo_gradient(global_N, local_N, error_N)
    assert update.indices.tolist() == [1]  # the visible entry goes at once
    assert update.values.tolist() == [large]
    assert error_N.tolist() == [small, 0.0]  # the invisible one waits in FP32

    update, error_N = gate_pseudo_gradient(global_N, local_N, error_N)
    assert update.indices.tolist() == [0, 1]  # 2 x 0.75 half-ULPs now moves the BF16 value
    assert update.values.tolist() == [2 * small, large]
    assert error_N.tolist() == [0.0, 0.0]


def test_error_feedback_never_loses_mass():
    generator = torch.Generator().manual_seed(0)
    numel = 4096
    # BF16-representable weights and deltas on a 2**-16 grid: every FP32 sum below is exact.
    global_N = (torch.randn(numel, generator=generator) * 0.05).to(torch.bfloat16).float()
    error_N = torch.zeros(numel)
    sent_total, delta_total = torch.zeros(numel), torch.zeros(numel)
    for _ in range(6):
        delta_N = torch.randint(-64, 65, (numel,), generator=generator).float() * 2.0**-16
        update, error_N = gate_pseudo_gradient(global_N, global_N - delta_N, error_N)
        sent_total[update.indices] += update.values
        delta_total += delta_N
        assert 0 < update.indices.numel() < numel
    assert torch.equal(sent_total + error_N, delta_total)


def test_a_replica_left_out_of_a_round_keeps_its_whole_pseudo_gradient_as_error():
    global_N = torch.tensor([1.5, 1.5, 0.0])
    error_N = torch.tensor([0.001, 0.0, 0.0])
    local_N = global_N - torch.tensor([0.002, 0.01, 1e-3])
    update, new_error_N = gate_pseudo_gradient(global_N, local_N, error_N.clone())
    assert update.indices.numel() == 2 and new_error_N[0] != 0  # some sent, some held back
    assert torch.equal(restore_error(update, new_error_N), error_N + (global_N - local_N))


def test_outer_step_is_torch_sgd_with_nesterov_momentum():
    generator = torch.Generator().manual_seed(1)
    global_N, momentum_N = torch.randn(64, generator=generator), torch.zeros(64)
    param = torch.nn.Parameter(global_N.clone())
    sgd = torch.optim.SGD([param], lr=0.7, momentum=0.9, nesterov=True)
    for _ in range(4):
        avg_N = torch.randn(64, generator=generator) * 1e-3
        outer_step(global_N, momentum_N, avg_N, OuterConfig())
        param.grad = avg_N.clone()
        sgd.step()
    assert torch.equal(global_N, param.detach())


def test_average_of_sparse_updates_counts_absent_entries_as_zero():
    a = SparseUpdate(torch.tensor([0, 2]), torch.tensor([1.0, 4.0]), 4)
    b = SparseUpdate(torch.tensor([2, 3]), torch.tensor([2.0, 8.0]), 4)
    assert average_sparse([a, b], 4).tolist() == [0.5, 0.0, 3.0, 4.0]


def test_flatten_and_unflatten_round_trip_in_sorted_name_order():
    tensors = {"b": torch.zeros(2, 2), "a": torch.zeros(3)}
    unflatten_into(torch.arange(7.0), tensors)
    assert tensors["a"].tolist() == [0.0, 1.0, 2.0]
    assert torch.equal(flatten(tensors), torch.arange(7.0))


def test_payloads_round_trip_bit_exactly_and_refuse_damage():
    generator = torch.Generator().manual_seed(2)
    numel = 100_000
    indices = torch.unique(torch.randint(numel, (3000,), generator=generator))
    update = SparseUpdate(indices, torch.randn(indices.numel(), generator=generator), numel)
    layout = layout_hash([("w", (numel,))])
    payload = encode_sparse(update, layout, round_index=7, replica=1)
    header, decoded = decode_sparse(payload, layout)
    assert (header.round_index, header.replica, header.count) == (7, 1, indices.numel())
    assert torch.equal(decoded.indices, update.indices)
    assert torch.equal(decoded.values.view(torch.int32), update.values.view(torch.int32))
    assert len(payload) < 0.4 * 4 * numel  # far below the dense FP32 vector
    with pytest.raises(PayloadError, match="another model"):
        decode_sparse(payload, layout ^ 1)
    damaged = bytearray(payload)
    damaged[-5] ^= 0xFF
    with pytest.raises(PayloadError, match="corrupted"):
        decode_sparse(bytes(damaged), layout)
    with pytest.raises(PayloadError, match="truncated"):
        decode_sparse(payload[:20], layout)
    dense = torch.randn(50, generator=generator)
    _, back = decode_dense(encode_dense(dense, layout, round_index=0, replica=0), layout)
    assert torch.equal(back, dense)


def test_empty_sparse_payload_round_trips():
    update = SparseUpdate(torch.zeros(0, dtype=torch.int64), torch.zeros(0), 10)
    _, decoded = decode_sparse(encode_sparse(update, 5, round_index=0, replica=0), 5)
    assert decoded.indices.numel() == 0


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: OuterConfig(lr=0.0), "OuterConfig.lr"),
        (lambda: OuterConfig(momentum=1.0), "OuterConfig.momentum"),
        (lambda: ExchangeConfig(timeout_s=0), "ExchangeConfig.timeout_s"),
        (lambda: ExchangeConfig(missing_policy="ignore"), "ExchangeConfig.missing_policy"),
        (lambda: LocoRunConfig(modes=("fsdp",)), "LocoRunConfig.modes"),
        (lambda: LocoRunConfig(num_replicas=0), "LocoRunConfig.num_replicas"),
        (lambda: LocoRunConfig(inner_steps=0), "LocoRunConfig.rounds and inner_steps"),
        (lambda: LocoRunConfig(transport="mpi"), "LocoRunConfig.transport"),
        (lambda: LocoRunConfig(exchange=ExchangeConfig(missing_policy="survivors")), "missing_policy must be 'wait'"),
        (lambda: TaskConfig(name="cnn"), "TaskConfig.name"),
        (lambda: TaskConfig(lr=0.5), "TaskConfig.lr"),
    ],
)
def test_bad_config_is_refused_with_a_clear_value_error(build, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.").replace("(", r"\(")):
        build()


def test_a_replica_started_from_a_start_state_continues_exactly_like_the_run_that_saved_it():
    from workers.pulse.loco.tasks import LMTask

    config = TaskConfig(name="lm", size="tiny", lr=1e-6, eval_batches=1)
    original = LMTask(config, replica=0, start=None)
    for step in range(3):
        original.local_step(step)
    clone = LMTask(config, replica=0, start=original.start_state())  # weights and AdamW moments
    clone.shard.set_state(original.shard.get_state())
    original.local_step(3)
    clone.local_step(3)
    for (name, a), b in zip(original.model.named_parameters(), clone.model.parameters(), strict=False):
        assert torch.equal(a, b), name


def bench_events(sent: dict[str, tuple[int, float]], final: dict[str, list[float]]) -> list[dict]:
    """Two replicas, one round per mode: payload size and density, and replica 0's final held-out values."""
    events = []
    for mode, (size, density) in sent.items():
        for replica in (0, 1):
            evaluated = replica == 0
            start = (
                {
                    "eval_metric": 1.0,
                    "eval_stderr": 0.1,
                    "eval_values": [1.0] * 4,
                    "eval_bf16_metric": 1.0,
                    "eval_bf16_values": [1.0] * 4,
                }
                if evaluated
                else {"eval_metric": None}
            )
            values = final[mode]
            end = (
                {
                    "eval_metric": sum(values) / 4,
                    "eval_stderr": 0.1,
                    "eval_values": values,
                    "eval_bf16_metric": 1.0,
                    "eval_bf16_values": [1.0] * 4,
                }
                if evaluated
                else {"eval_metric": None}
            )
            counted = {str(r): {"bytes": size, "values": round(density * 200), "exchanges": 1} for r in (0, 1)}
            events.append({"event": "start", "mode": mode, "replica": replica, **start})
            events.append(
                {
                    "event": "round",
                    "mode": mode,
                    "replica": replica,
                    "round": 0,
                    "bytes_sent": size,
                    "density": density,
                    "values_sent": round(density * 200),
                    "numel": 200,
                    "encode_s": 0.0,
                    "sync_s": 0.0,
                    "weights_hash": mode,
                    "train_metric": 0.0,
                    "counted": counted,
                    **end,
                }
            )
    return events


def test_bench_summary_divides_diloco_and_ddp_bytes_by_pulseloco_bytes():
    from workers.bench.loco import summarise
    from workers.pulse.loco.launch import LocoRun

    sent = {"ddp": (8000, 1.0), "diloco": (1000, 1.0), "pulseloco": (50, 0.05)}
    final = {"ddp": [0.5] * 4, "diloco": [0.5, 0.6, 0.7, 0.8], "pulseloco": [0.5, 0.6, 0.7, 0.8]}
    config = LocoRunConfig(modes=("ddp", "diloco", "pulseloco"), rounds=1, inner_steps=8)
    figures = summarise(config, LocoRun(bench_events(sent, final), {0: 0, 1: 0}, 1.0))
    assert figures["bytes_ratio_vs_diloco"] == 20.0
    assert figures["bytes_ratio_vs_ddp"] == 160.0
    assert figures["sparsity"] == pytest.approx(0.95)
    assert figures["targets_met"] == {"bytes_ratio_vs_diloco": True, "bytes_ratio_vs_ddp": True, "sparsity": True}
    assert figures["progress_ratio_vs_diloco"] == pytest.approx(1.0)
    assert figures["final_metric_within_noise"] and figures["final_metric_diff_vs_diloco"] == 0.0


def test_bench_compares_final_metrics_pairwise_over_the_same_held_out_items():
    from workers.bench.loco import summarise
    from workers.pulse.loco.launch import LocoRun

    sent = {"ddp": (8000, 1.0), "diloco": (1000, 1.0), "pulseloco": (50, 0.05)}
    # Items vary a lot (a large unpaired standard error), but PULSELoCo is worse on every one of them.
    diloco = [0.1, 0.9, 0.3, 0.7]
    final = {"ddp": diloco, "diloco": diloco, "pulseloco": [v + 0.01 for v in diloco]}
    config = LocoRunConfig(modes=("ddp", "diloco", "pulseloco"), rounds=1, inner_steps=8)
    figures = summarise(config, LocoRun(bench_events(sent, final), {0: 0, 1: 0}, 1.0))
    assert figures["final_metric_diff_vs_diloco"] == pytest.approx(0.01)
    assert not figures["final_metric_within_noise"]
    assert figures["final_bf16_metric_within_noise"]
