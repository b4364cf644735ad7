"""Rollout and training agree: on the real-model path (a diffusers pipeline, LoRA, true CFG, BF16 forwards), the PPO
ratio of the update's first minibatch is exactly 1 on the CPU, against the rollout's own log-probs and against the
recomputed ones the train phase uses."""

from __future__ import annotations

import dataclasses

import pytest

from workers.algo.sampler import SamplerConfig
from workers.model.families.diffusers_policy import load_model_policy
from workers.trainer.grpo_trainer import GRPOTrainer
from workers.trainer.old_log_probs import first_minibatch_ratio
from workers.trainer.presets import get_preset


@pytest.mark.slow
def test_the_first_minibatch_ratio_is_exactly_one_on_the_cpu(pipelines):
    policy = load_model_policy(pipelines["qwen-image"], resolution=32, lora_rank=4, guidance=4.0)
    base = get_preset("cpu_smoke")
    config = dataclasses.replace(
        base,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=4, noise_level=0.7, forward_dtype="bf16"),
        grpo=dataclasses.replace(base.grpo, num_minibatches=2),
    )
    trainer = GRPOTrainer(policy, config)
    batch = trainer.collect(0)
    assert first_minibatch_ratio(trainer, batch) == {"rollout_vs_train": 0.0, "recomputed": 0.0}
    # the update itself: one minibatch, one epoch, so its stats are the first minibatch's, before its step
    one = GRPOTrainer(policy, dataclasses.replace(config, grpo=dataclasses.replace(config.grpo, num_minibatches=1)))
    stats = one.update(batch, recompute_old_log_probs=True)
    assert stats["approx_kl"] == 0.0 and stats["clip_frac"] == 0.0 and stats["grad_norm"] > 0
