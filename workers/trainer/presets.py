"""Named training presets: functions that return a complete TrainConfig.

Example:
    config = get_preset("cpu_tiny")
    config = dataclasses.replace(config, iterations=10)
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.trainer.grpo_trainer import TrainConfig


def cpu_tiny() -> TrainConfig:
    """The pipeline's default (`spotlight run`, `make demo`): the shipped 2.5M-parameter base on 2 CPU cores, 20 iterations.

    The NFT objective (advantage-weighted flow matching, DiffusionNFT's adaptive x0-space
    weighting) on deterministic ODE rollouts, the sampler validation uses. Why, and what
    it has achieved: docs/RECIPE.md.
    """
    return TrainConfig(
        iterations=20,
        prompts_per_iteration=8,
        group_size=8,
        reward="minigeneval",
        sampler=SamplerConfig(num_steps=8, noise_level=0.0),
        grpo=GRPOConfig(objective="nft", lr=1e-4, adv_clip=5.0, kl_beta=0.0, num_epochs=1, num_minibatches=2,
                        nft_beta=1.0, nft_timesteps=2, nft_adv_scale=2.0, nft_weighting="adaptive"),
        validate_every=5,
        validation_seeds=2,
    )


def cpu_tiny_long() -> TrainConfig:
    """`spotlight train`'s default: cpu_tiny spending more of the 15-minute budget on 2 CPU cores.

    Each prompt draws 16 samples and the update keeps the 8 of largest reward variance (drawing
    is cheap next to scoring in the update); each kept image is scored at 6 noise levels per
    update instead of 2; 40 iterations. Over eight seeds it gains about +0.15 held-out strict to
    cpu_tiny's +0.07, every seed at least +0.09 (docs/BENCHMARKS.md, docs/RECIPE.md).
    """
    base = cpu_tiny()
    return dataclasses.replace(base, iterations=40, rollouts_per_prompt=16,
                               grpo=dataclasses.replace(base.grpo, nft_timesteps=6))


def cpu_tiny_flow_grpo() -> TrainConfig:
    """Flow-GRPO's recipe on the same budget: SDE rollouts (noise level 0.7) on a 4-step window,
    PPO-clip on the step log-probs. Kept for comparison (docs/RECIPE.md)."""
    return TrainConfig(
        iterations=20,
        prompts_per_iteration=8,
        group_size=8,
        reward="minigeneval",
        sampler=SamplerConfig(num_steps=8, noise_level=0.7, sde_window=(0, 4)),
        grpo=GRPOConfig(lr=5e-5, clip_range=1e-4, adv_clip=5.0, kl_beta=0.0, num_epochs=1, num_minibatches=2),
        validate_every=5,
        validation_seeds=2,
    )


def cpu_smoke() -> TrainConfig:
    """Two small iterations: checks the whole loop runs (tests, CI), not that it learns."""
    return TrainConfig(
        iterations=2,
        prompts_per_iteration=2,
        group_size=4,
        sampler=SamplerConfig(num_steps=4, noise_level=0.7),
        grpo=GRPOConfig(num_minibatches=1),
        validate_every=1,
        validation_seeds=1,
    )


PRESETS: dict[str, Callable[[], TrainConfig]] = {
    "cpu_tiny": cpu_tiny, "cpu_tiny_long": cpu_tiny_long, "cpu_tiny_flow_grpo": cpu_tiny_flow_grpo,
    "cpu_smoke": cpu_smoke,
}


def get_preset(name: str) -> TrainConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()
