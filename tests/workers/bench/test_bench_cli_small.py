"""Each `spotlight bench ... --json` that docs/BENCHMARKS.md and the README quote, at its smallest size: the command
runs, and its figures mean what the docs say (sizes add up, sparse beats dense, nothing is lost), not only that
the keys exist. The figures themselves come from the full-size commands, never from these runs."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from typer.testing import CliRunner

from pipelines.cli import app


@pytest.fixture(autouse=True)
def _torch_threads():
    """Some benches pin torch to one thread, as their worker processes run; the session keeps its own setting."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _bench(*args: str) -> list[dict]:
    """The JSON Lines a `spotlight bench` command printed on stdout (its progress goes to stderr)."""
    done = CliRunner().invoke(app, ["bench", *args, "--json"], env={"COLUMNS": "400"})
    assert done.exit_code == 0, done.output + repr(done.exception)
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def test_bench_pulse_quick_sends_fewer_bytes_than_dense_and_restores_every_state_bit_exactly():
    (figures,) = _bench("pulse", "--quick", "--no-dit")
    assert figures["quick"] and figures["num_states"] == 33
    assert figures["dense_bytes"] == 2 * figures["model"]["num_parameters"]  # dense = every BF16 value, 2 bytes
    assert figures["bitwise_exact"] is True
    k1, k8, k32 = (figures["by_k"][k] for k in ("1", "8", "32"))
    assert (k1["num_pairs"], k8["num_pairs"], k32["num_pairs"]) == (32, 4, 1)  # 33 states, pairs k apart
    # Farther-apart states differ in more values, so sparse patches save less, but always something.
    assert 0 < k1["changed_fraction_mean"] < k8["changed_fraction_mean"] < k32["changed_fraction_mean"] < 1
    assert k1["absolute_ratio_vs_dense"] > k8["absolute_ratio_vs_dense"] > k32["absolute_ratio_vs_dense"] > 1
    # A changed value costs its index and its bytes: more than the one-ULP delta encoding, less than 4 bytes.
    assert 0 < k1["ulp_delta_bytes_per_changed"] < k1["absolute_bytes_per_changed"] < 4
    synthetic = figures["synthetic_1pct"]
    assert synthetic["changed_fraction"] == pytest.approx(0.01, rel=0.05)
    assert synthetic["absolute_bitwise_exact"] and synthetic["ulp_delta_bitwise_exact"]
    # At 1 % changed, the patch is dense size x 1 % x (bytes per changed / 2 bytes): the ratio follows from them.
    expected = 2 / (synthetic["changed_fraction"] * synthetic["absolute_bytes_per_changed"])
    assert synthetic["absolute_ratio_vs_dense"] == pytest.approx(expected, rel=0.02)
    detailed = figures["detailed_k1"]
    assert detailed["absolute_bitwise_exact"] and detailed["ulp_delta_bitwise_exact"]
    assert all(_positive(detailed[k]) for k in ("absolute_encode_gbps", "absolute_apply_gbps", "hash_gbps"))
    for name, target in figures["targets"].items():
        assert isinstance(target["met"], bool), name


def test_bench_store_times_every_backend_both_ways_at_the_sizes_asked_and_leaves_nothing_behind(tmp_path):
    extra = tmp_path / "extra-store"
    rows = _bench("store", "--large-mib", "1", "--num-small", "3", "--url", str(extra))
    backends = {"local", "local (fsync off)", "s3 (moto, in-process)", str(extra)}
    assert {r["backend"] for r in rows} == backends
    sizes = {"small": (3, 64 * 1024), "large": (2, 1024 * 1024)}
    for backend in backends:
        for objects, (count, size) in sizes.items():
            mine = [r for r in rows if r["backend"] == backend and r["objects"] == objects]
            assert {(r["op"], r["mode"]) for r in mine} == {
                ("put", "raw"),
                ("get", "raw"),
                ("put", "committed"),
                ("get", "committed"),
            }, (backend, objects)
            for r in mine:
                assert (r["count"], r["object_bytes"]) == (count, size)
                assert _positive(r["MB_per_s"]) and _positive(r["objects_per_s"])
                assert r["MB_per_s"] == pytest.approx(r["objects_per_s"] * size / 1e6, rel=0.01, abs=0.1)
    # The bench deletes what it wrote: a user's store is left as it was.
    assert not [p for p in extra.rglob("*") if p.is_file()]


def test_bench_coordinator_small_counts_what_it_was_asked_and_batched_ledger_writes_beat_unbatched():
    redis = shutil.which("redis-server") is not None
    (figures,) = _bench(
        "coordinator",
        "--requests",
        "300",
        "--claims",
        "40",
        "--ledger-rows",
        "200",
        "--workers",
        "4",
        *(() if redis else ("--no-redis",)),
    )
    backends = ("queue_sqlite", "queue_redis") if redis else ("queue_sqlite",)
    assert ("queue_redis" in figures) == redis
    for name in backends:
        queue = figures[name]
        assert queue["requests_in_queue"] == 300
        assert 0 < queue["claims_timed"] <= 40
        assert all(_positive(queue[k]) for k in ("puts_per_s", "claims_per_s", "acks_per_s")), name
    ledger = figures["ledger"]
    assert ledger["rows_batched"] == 200
    assert ledger["rows_per_s_batched"] > ledger["rows_per_s_unbatched"] > 0  # why the coordinator batches
    iteration = figures["iteration"]
    assert iteration["workers"] == 4
    assert iteration["requests"] == 4 * figures["config"]["requests_per_worker"]
    # The share of a simulated iteration that coordination costs: a part of the whole, the whole being the workers'.
    assert 0 < iteration["coordinator_share"] < 1
    assert iteration["coordinator_s"] < iteration["simulated_worker_s"]


def test_bench_rollout_smallest_batch_reports_consistent_throughput_of_the_shipped_base():
    (ode,) = _bench("rollout", "--batch-size", "8", "--num-steps", "2", "--repeats", "1")
    assert (ode["batch_size"], ode["num_steps"], ode["objective"], ode["sde_steps"]) == (8, 2, "nft", 0)
    assert ode["model"] == "shipped base" and ode["params_M"] == ode["trainable_params_M"] > 0
    assert _positive(ode["rollout_s"]) and _positive(ode["grpo_update_s"])
    assert ode["samples_per_s"] == pytest.approx(8 / ode["rollout_s"], rel=0.01)
    assert ode["grpo_samples_per_s"] == pytest.approx(8 / ode["grpo_update_s"], rel=0.01)
    assert 0 <= ode["off_device_share"] < 1
    done = CliRunner().invoke(app, ["bench", "rollout", "--batch-size", "12", "--json"])
    assert done.exit_code == 2 and "multiple of 8" in done.output


@pytest.mark.slow
def test_bench_loco_quick_syncs_a_sparse_share_of_the_bytes_and_keeps_replicas_identical():
    (figures,) = _bench("loco", "--quick", "--no-dit")
    assert figures["quick"] and "dit" not in figures
    (run,) = figures["lm"].values()
    ddp, diloco, pulse = (run["modes"][m] for m in ("ddp", "diloco", "pulseloco"))
    # Every replica holds the same weights after every round, in each mode: nothing was lost in sync.
    assert run["weights_identical_every_round"] and all(
        m["weights_identical_every_round"] for m in (ddp, diloco, pulse)
    )
    # DDP syncs FP32 gradients every step, DiLoCo FP32 pseudo-gradients every round: 4 bytes per value sent.
    assert ddp["bytes_per_sent_value"] == pytest.approx(4, abs=0.01)
    assert diloco["bytes_per_sent_value"] == pytest.approx(4, abs=0.01)
    assert diloco["bytes_per_replica"] == pytest.approx(run["rounds"] * 4 * run["numel"], rel=0.01)
    assert ddp["bytes_per_replica"] == pytest.approx(run["inner_steps"] * diloco["bytes_per_replica"], rel=0.01)
    # PULSELoCo sends only the BF16-visible share: most values stay home, each sent one costs under 4 bytes.
    assert 0 < pulse["sparsity"] < 1 and pulse["sparsity"] == run["sparsity"]
    assert len(pulse["sparsity_by_round"]) == run["rounds"] == len(pulse["bytes_per_replica_by_round"])
    assert 0 < pulse["bytes_per_sent_value"] < 4
    assert pulse["bytes_per_replica"] < diloco["bytes_per_replica"] < ddp["bytes_per_replica"]
    assert run["bytes_ratio_vs_diloco"] == pytest.approx(diloco["bytes_per_replica"] / pulse["bytes_per_replica"])
    assert all(len(m["eval_curve"]) == run["rounds"] + 1 for m in (ddp, diloco, pulse))


@pytest.mark.nightly
@pytest.mark.slow
def test_bench_elastic_one_repeat_regroups_faster_than_restarting_and_its_parts_add_up():
    (figures,) = _bench("elastic", "--repeats", "1")
    for path in ("elastic", "naive"):
        for event in ("lost", "join"):
            f = figures[path][event]
            parts = ("process_start_s", "rendezvous_s", "weight_transfer_s", "warmup_s")
            assert _positive(f["total_s"]) and all(f[p] >= 0 and math.isfinite(f[p]) for p in parts), (path, event)
            assert sum(f[p] for p in parts) == pytest.approx(f["total_s"], rel=0.05, abs=0.005), (path, event)
    # The node agent keeps warm processes: nothing to start, where the naive path starts a process.
    assert figures["elastic"]["lost"]["process_start_s"] == 0 < figures["naive"]["lost"]["process_start_s"]
    for event in ("lost", "join"):
        assert figures["elastic"][event]["total_s"] < figures["naive"][event]["total_s"]
        assert figures["speedup"][event] == pytest.approx(
            figures["naive"][event]["total_s"] / figures["elastic"][event]["total_s"], rel=0.06
        )
    assert figures["bandwidth"]["weight_bytes"] == pytest.approx(figures["setup"]["params_M"] * 4e6, rel=0.001)
    throughput = figures["throughput"]
    assert _positive(throughput["degree1_rps"]) and _positive(throughput["degree2_rps"])
    assert figures["target_met"] == (figures["elastic"]["total_s"] < 1 and figures["speedup"]["worst_case"] >= 10)
    assert figures["projection_20b_8gpu_nvlink"]["label"].startswith("PROJECTION")
