"""FSDP2 data parallelism (workers/trainer/fsdp.py) and gradient checkpointing (workers/trainer/memory.py).

Two gloo processes run the update one process runs, on the same batch from the same weights, and must end at
the same weights with the same stats. Tolerance: FP32 forwards; the reduce-scatter adds the ranks' gradients
in another order than one backward does, so agreement is to float rounding, not bit-identity: DIST_ATOL =
1e-5 on the weights (measured: at most 2.1e-6, after two AdamW steps that move them by 2e-3). Checkpointing
in one process is bit-identical.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.procs import run_spawned
from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.trainer.fsdp import DataShard, check_batch_split, full_weights
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig
from workers.trainer.memory import enable_gradient_checkpointing, gradient_checkpointing_enabled

DIST_ATOL = 1e-5
WORLD_SIZE = 2


@dataclass(frozen=True)
class Case:
    policy: str
    """"pixel" (the tiny MiniGenEval policy) or "qwen-image" (a tiny pipeline with a rank-4 LoRA)."""
    objective: str
    prompts: int = 2
    group_size: int = 4
    kl_beta: float = 0.0
    checkpointing: bool = False
    """Gradient checkpointing on the ranks only (the single process runs without it)."""
    micro_batch: int | None = None


CASES = {
    "pixel_nft_with_kl": Case("pixel", "nft", kl_beta=0.1),
    # 6 samples in 2 minibatches of 3: rank 0 takes 2, rank 1 takes 1, so a wrong loss share shows.
    "pixel_flow_grpo_uneven_split": Case("pixel", "flow_grpo", prompts=3, group_size=2),
    # Micro-batches of 1 on that split: rank 0 runs 2, rank 1 runs 1 and must join a second, zero-share one,
    # or the ranks' FSDP collectives fall out of step and the run hangs.
    "pixel_nft_uneven_micro_batches": Case("pixel", "nft", prompts=3, group_size=2, micro_batch=1),
    "pixel_flow_grpo_uneven_micro_batches": Case("pixel", "flow_grpo", prompts=3, group_size=2, micro_batch=1),
    "qwen_lora_nft_checkpointed": Case("qwen-image", "nft", checkpointing=True),
    # Under LoRA, v_old (NFT) and the KL reference are adapter swaps on the sharded transformer.
    "qwen_lora_flow_grpo_with_kl": Case("qwen-image", "flow_grpo", kl_beta=0.1),
}


def _config(case: Case) -> TrainConfig:
    return TrainConfig(
        prompts_per_iteration=case.prompts,
        group_size=case.group_size,
        micro_batch=case.micro_batch,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=3, forward_dtype="fp32"),
        grpo=GRPOConfig(objective=case.objective, lr=1e-3, clip_range=10.0, num_minibatches=2, kl_beta=case.kl_beta),
    )


def _policy(case: Case, pipeline: Path):
    if case.policy == "pixel":
        from workers.model.tiny_policy import PolicyConfig, build_policy

        config = PolicyConfig(image_size=16, num_layers=1, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
        return build_policy(config, seed=0).eval()
    from workers.model.families.diffusers_policy import load_model_policy

    return load_model_policy(pipeline, resolution=32, lora_rank=4)


def _rank_main(rank: int, init_file: str, work: str) -> None:
    """One data-parallel rank: every case's update from the saved weights and batch; results to work/."""
    torch.set_num_threads(1)
    from workers.trainer.fsdp import distribute, init_distributed

    mesh = init_distributed("cpu", f"file://{init_file}", rank, WORLD_SIZE)
    for name, case in CASES.items():
        saved = torch.load(Path(work) / f"{name}.pt", weights_only=False)
        policy = _policy(case, Path(work) / "qwen")
        policy.load_weights(saved["initial"])
        trainer = GRPOTrainer(policy, _config(case))
        if case.checkpointing:
            enable_gradient_checkpointing(policy)
        distribute(trainer, mesh)
        stats = trainer.update(saved["batch"])
        torch.save({"stats": stats, "weights": full_weights(policy)}, Path(work) / f"{name}.rank{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    """{case: (initial weights, single-process result, [each rank's result])}; results hold stats and weights."""
    from workers.model.families.tiny import build_tiny_pipeline

    work = tmp_path_factory.mktemp("fsdp")
    build_tiny_pipeline("qwen-image", work / "qwen")
    single = {}
    for name, case in CASES.items():
        policy = _policy(case, work / "qwen")
        initial = {k: v.clone() for k, v in policy.weights().items()}
        trainer = GRPOTrainer(policy, _config(case))
        batch = trainer.collect(0)
        assert batch.advantages.abs().sum() > 0, "the case's groups need reward contrast"
        torch.save({"initial": initial, "batch": batch}, work / f"{name}.pt")
        single[name] = (initial, {"stats": trainer.update(batch), "weights": full_weights(policy)})
    run_spawned(_rank_main, lambda r: (r, str(work / "init"), str(work)), WORLD_SIZE, timeout_s=300)
    ranks = {name: [torch.load(work / f"{name}.rank{r}.pt") for r in range(WORLD_SIZE)] for name in CASES}
    return {name: (*single[name], ranks[name]) for name in CASES}


STAT_KEYS = ("loss", "grad_norm", "kl", "clip_frac", "approx_kl", "fm_loss", "drift")


@pytest.mark.slow  # spawns two processes that import torch and diffusers (~40 s here)
@pytest.mark.parametrize("name", list(CASES))
def test_two_gloo_ranks_update_to_the_weights_one_process_reaches(updates, name):
    initial, single, ranks = updates[name]
    moved = max(float((single["weights"][k] - initial[k]).abs().max()) for k in initial)
    assert moved > 100 * DIST_ATOL, "the update must move the weights for the comparison to mean anything"
    for result in ranks:
        torch.testing.assert_close(result["weights"], single["weights"], atol=DIST_ATOL, rtol=1e-4)
        assert result["stats"]["optimizer_steps"] == single["stats"]["optimizer_steps"] == 2
        for key in STAT_KEYS:
            if key in single["stats"]:
                assert result["stats"][key] == pytest.approx(single["stats"][key], rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_every_rank_reports_the_same_stats(updates):
    for _, _, ranks in updates.values():
        first, *rest = ranks
        for other in rest:
            assert {k: other["stats"][k] for k in STAT_KEYS if k in first["stats"]} == {
                k: first["stats"][k] for k in STAT_KEYS if k in first["stats"]
            }


def test_ranks_take_contiguous_parts_whose_shares_sum_to_one():
    for minibatch in (2, 3, 7, 8):
        for world in range(1, minibatch + 1):
            parts = [DataShard(r, world, torch.device("cpu")).part(minibatch) for r in range(world)]
            positions = [i for part, _ in parts for i in range(minibatch)[part]]
            assert positions == list(range(minibatch))
            assert sum(share for _, share in parts) == pytest.approx(1.0)
            assert max(s for _, s in parts) - min(s for _, s in parts) <= 1 / minibatch + 1e-12


def test_a_minibatch_smaller_than_the_world_size_is_refused():
    with pytest.raises(ValueError, match="cannot be split over 4 ranks"):
        DataShard(0, 4, torch.device("cpu")).part(3)
    with pytest.raises(ValueError, match="minibatches"):
        check_batch_split(num_samples=8, num_minibatches=4, world_size=3)  # minibatches of 2
    check_batch_split(num_samples=8, num_minibatches=2, world_size=4)
    with pytest.raises(ValueError, match="rank"):
        DataShard(2, 2, torch.device("cpu"))


@pytest.fixture(scope="module")
def qwen_pipeline(tmp_path_factory):
    from workers.model.families.tiny import build_tiny_pipeline

    return build_tiny_pipeline("qwen-image", tmp_path_factory.mktemp("qwen") / "qwen")


def _count_block_forwards(policy) -> list[int]:
    """Counts the first block's forward runs (a wrapper, not a forward hook: checkpoint's recompute skips hooks)."""
    block, calls = policy.transformer.transformer_blocks[0], [0]
    forward = block.forward

    def counted(*args, **kwargs):
        calls[0] += 1
        return forward(*args, **kwargs)

    block.forward = counted
    return calls


@pytest.mark.parametrize("objective", ["nft", "flow_grpo"])
def test_gradient_checkpointing_recomputes_blocks_and_leaves_the_update_unchanged(qwen_pipeline, objective):
    """Full fine-tuning of the tiny Qwen-Image under BF16 autocast, with and without checkpointing."""
    import copy

    from workers.model.families.diffusers_policy import load_model_policy

    config = TrainConfig(
        prompts_per_iteration=2,
        group_size=2,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=2, forward_dtype="bf16"),
        grpo=GRPOConfig(objective=objective, lr=1e-3, clip_range=10.0, num_minibatches=1),
    )
    plain = load_model_policy(qwen_pipeline, resolution=32, lora_rank=0)
    checkpointed = copy.deepcopy(plain)
    enable_gradient_checkpointing(checkpointed)
    assert gradient_checkpointing_enabled(checkpointed) and not gradient_checkpointing_enabled(plain)
    batch = GRPOTrainer(copy.deepcopy(plain), config).collect(0)
    results = []
    for policy in (plain, checkpointed):
        calls = _count_block_forwards(policy)
        stats = GRPOTrainer(policy, config).update(batch)
        results.append((stats, calls[0], policy.weights()))
    (plain_stats, plain_calls, plain_weights), (ckpt_stats, ckpt_calls, ckpt_weights) = results
    assert ckpt_calls > plain_calls  # the blocks ran again in backward
    assert ckpt_stats["grad_norm"] == pytest.approx(plain_stats["grad_norm"], rel=1e-6)
    torch.testing.assert_close(ckpt_weights, plain_weights, atol=0, rtol=0)


def test_checkpointing_a_policy_without_a_diffusers_transformer_is_refused():
    with pytest.raises(ValueError, match="gradient checkpointing"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))
