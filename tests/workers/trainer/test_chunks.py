"""Memory knobs that must not change what is computed: VAE decoding and sampling in chunks (--rollout-batch), and
micro-batches with gradient accumulation (--micro-batch)."""

import dataclasses

import pytest
import torch

from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.model.families.diffusers_policy import load_model_policy
from workers.model.families.tiny import build_tiny_pipeline
from workers.task.render import to_uint8
from workers.trainer.chunks import micro_parts
from workers.trainer.fsdp import DataShard
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig

LR = 1e-3
"""The trainers' learning rate (_trainer): AdamW's first step moves a weight by about this much."""


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory):
    return build_tiny_pipeline("qwen-image", tmp_path_factory.mktemp("qwen") / "qwen")


def _vae_batches(policy) -> list[int]:
    """Every batch size the VAE's decoder is called with from now on (a forward pre-hook on diffusers' own module)."""
    seen: list[int] = []
    policy.frozen.vae.decoder.register_forward_pre_hook(lambda module, args: seen.append(int(args[0].shape[0])))
    return seen


def test_decoding_in_chunks_gives_the_one_shot_images_and_the_vae_never_sees_more_than_a_chunk(qwen_folder):
    policy = load_model_policy(qwen_folder, resolution=32, lora_rank=0)
    latents = torch.randn(10, *policy.latent_shape, generator=torch.Generator().manual_seed(0))
    seen = _vae_batches(policy)
    whole = policy.decode(latents, batch_size=10)
    assert seen == [10]
    seen.clear()
    chunked = policy.decode(latents, batch_size=3)
    assert seen == [3, 3, 3, 1]
    # Equal up to the conv kernels' rounding for another batch size (about 1e-6): the same uint8 images but for a
    # rare value on a rounding boundary.
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=0)
    assert (to_uint8(chunked).astype(int) - to_uint8(whole).astype(int)).__abs__().max() <= 1
    with pytest.raises(ValueError, match="batch_size"):
        policy.decode(latents, batch_size=0)


def _trainer(folder, **fields):
    config = TrainConfig(
        prompts_per_iteration=2,
        group_size=4,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=3, noise_level=0.7, forward_dtype="fp32"),
        grpo=GRPOConfig(num_minibatches=1, lr=LR, clip_range=10.0),
        **fields,
    )
    return GRPOTrainer(load_model_policy(folder, resolution=32, lora_rank=4), config)


def test_collecting_in_chunks_samples_the_one_shot_batch_and_decodes_chunk_by_chunk(qwen_folder):
    whole = _trainer(qwen_folder).collect(0)
    trainer = _trainer(qwen_folder, rollout_batch=3)
    seen = _vae_batches(trainer.policy)
    chunked = trainer.collect(0)
    assert sum(seen) == 8 and max(seen) <= 3  # 8 samples, decoded 3 at most at a time
    assert chunked.trajectory.seeds == whole.trajectory.seeds and chunked.trajectory.prompts == whole.trajectory.prompts
    torch.testing.assert_close(chunked.trajectory.latents, whole.trajectory.latents, atol=1e-4, rtol=0)
    torch.testing.assert_close(chunked.trajectory.log_probs, whole.trajectory.log_probs, atol=1e-3, rtol=1e-5)
    assert abs(chunked.images.astype(int) - whole.images.astype(int)).max() <= 1


def test_micro_parts_cover_the_part_once_with_shares_summing_to_its_share():
    assert micro_parts(slice(None), 10, None) == [(slice(0, 10), 1.0)]
    parts = micro_parts(slice(2, 9), 10, 3)
    assert [p for p, _ in parts] == [slice(2, 5), slice(5, 8), slice(8, 9)]
    assert sum(s for _, s in parts) == pytest.approx(0.7)


def test_micro_parts_pad_a_smaller_rank_part_with_zero_share_repeats():
    """Parts 0:5 and 5:9 of 9 in micro-batches of 2: 3 and 2 micro-batches; the second rank pads to 3."""
    padded = micro_parts(slice(5, 9), 9, 2, count=3)
    assert padded == [(slice(5, 7), 2 / 9), (slice(7, 9), 2 / 9), (slice(7, 9), 0.0)]
    assert micro_parts(slice(0, 5), 9, 2, count=3) == micro_parts(slice(0, 5), 9, 2)
    shard = DataShard(rank=1, world_size=2, device=torch.device("cpu"))
    assert shard.micro_count(9, 2) == 3 and shard.micro_count(9, None) == 1 and shard.micro_count(8, 2) == 2


@pytest.mark.parametrize("objective", ["flow_grpo", "nft"])
def test_micro_batches_take_the_whole_minibatchs_step(qwen_folder, objective):
    """Gradient accumulation over micro-batches of 3 (of a minibatch of 8) leaves the weights where one forward
    and backward over the minibatch leaves them, and reports the same loss."""

    def run(micro_batch):
        trainer = _trainer(qwen_folder, micro_batch=micro_batch)
        trainer.config = dataclasses.replace(
            trainer.config,
            grpo=dataclasses.replace(trainer.config.grpo, objective=objective, num_minibatches=1, kl_beta=0.0),
        )
        if objective == "nft":
            trainer = GRPOTrainer(trainer.policy, trainer.config)
        batch = trainer.collect(0)
        stats = trainer.update(batch)
        return stats, {k: v.detach().clone() for k, v in trainer.policy.weights().items()}

    base_stats, base = run(None)
    micro_stats, micro = run(3)
    moved = sum(float((base[k] - v).abs().sum()) for k, v in run(None)[1].items())
    assert moved == 0.0  # the comparison is deterministic: the same run twice is bit-identical
    initial = {k: v for k, v in load_model_policy(qwen_folder, resolution=32, lora_rank=4).weights().items()}
    assert any(not torch.equal(base[k], initial[k]) for k in base)  # the step moved the adapter
    # AdamW's first step moves each weight by lr * g / (|g| + eps): where a gradient nearly cancels, accumulating it in
    # micro-batches (another summation order) can move it by a small share of lr. Measured on an AMD EPYC under
    # ATEN_CPU_CAPABILITY=avx2: 1.4e-6 (one of 192 elements; docs/log/kernel-sets.md); a wrong step moves by about lr.
    for k in base:
        torch.testing.assert_close(micro[k], base[k], atol=LR / 100, rtol=1e-5)
    assert micro_stats["loss"] == pytest.approx(base_stats["loss"], rel=1e-4, abs=1e-7)
    assert micro_stats["grad_norm"] == pytest.approx(base_stats["grad_norm"], rel=1e-4)


def test_config_refuses_a_chunk_of_zero():
    with pytest.raises(ValueError, match="micro_batch"):
        TrainConfig(micro_batch=0)
    with pytest.raises(ValueError, match="rollout_batch"):
        TrainConfig(rollout_batch=0)


@pytest.mark.parametrize("level", ["fbcache", "half_steps"])
def test_exploring_in_chunks_scores_the_candidates_as_one_batch_does(qwen_folder, level):
    """Chunks of 3 of 5 candidate seeds, each chunk in a cache context of its own (a hook's state never crosses
    chunks), give the one-batch rewards."""
    from workers.explore.request import ExploreSpec, explore_rewards

    policy = load_model_policy(qwen_folder, resolution=32, guidance=3.0)
    sampler = SamplerConfig(num_steps=4, noise_level=0.0, forward_dtype="fp32")
    spec = ExploreSpec("demo", "two red circles", (1, 2, 3, 4, 5), 0, sampler, level, reward="jpeg_compressibility")
    seen = _vae_batches(policy)
    whole = explore_rewards(policy, spec)
    seen.clear()
    chunked = explore_rewards(policy, spec, chunk=3)
    assert seen == [3, 2]
    assert chunked == pytest.approx(whole, rel=1e-3, abs=1e-3)


def test_old_log_probs_are_recomputed_in_the_update_s_micro_batches_so_its_first_step_is_exactly_on_policy(qwen_folder):
    trainer = _trainer(qwen_folder, micro_batch=3)
    stats = trainer.update(trainer.collect(0), recompute_old_log_probs=True)
    assert stats["approx_kl"] == 0.0 and stats["clip_frac"] == 0.0
