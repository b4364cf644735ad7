"""Held-out validation: fixed prompts, fixed seeds, deterministic ODE sampling, GenEval-style score.

Fixed seeds and the ODE remove sampling noise from the comparison between checkpoints,
so a change in score is a change in the policy.

Example:
    result = evaluate(policy, split_prompts()["heldout"])
    result.score, result.per_category, result.per_criterion
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workers.task.detect import criterion_means, score_images
from workers.task.prompts import parse_prompt
from workers.task.render import decode_images
from workers.algo.sampler import SamplerConfig, rollout

VALIDATION_SEED_BASE = 1_000_000
"""Validation seeds are VALIDATION_SEED_BASE + k: disjoint from training seeds."""


@dataclass
class EvalResult:
    score: float
    """Share of images that satisfy every criterion of their prompt (GenEval's overall)."""
    partial: float
    """Mean share of criteria satisfied."""
    per_category: dict[str, float] = field(default_factory=dict)
    per_criterion: dict[str, float] = field(default_factory=dict)
    images: np.ndarray | None = None
    """uint8 (N, H, W, 3), in prompt-major order."""
    prompts: list[str] = field(default_factory=list)


def evaluate(policy, prompts: list[str], seeds_per_prompt: int = 2, num_steps: int = 8,
             batch_size: int = 64, keep_images: bool = False) -> EvalResult:
    """Score the policy on prompts x fixed seeds with the ODE sampler."""
    if seeds_per_prompt < 1:
        raise ValueError(f"seeds_per_prompt must be >= 1, got {seeds_per_prompt}")
    config = SamplerConfig(num_steps=num_steps, noise_level=0.0)
    all_prompts = [p for p in prompts for _ in range(seeds_per_prompt)]
    seeds = [VALIDATION_SEED_BASE + k for k in range(seeds_per_prompt)] * len(prompts)
    images = []
    for i in range(0, len(all_prompts), batch_size):
        traj = rollout(policy, all_prompts[i:i + batch_size], seeds[i:i + batch_size], config)
        images.append(decode_images(policy, traj.images))
    images_np = np.concatenate(images)
    scores = score_images(images_np, all_prompts)
    by_cat: dict[str, list[float]] = {}
    for p, s in zip(all_prompts, scores):
        by_cat.setdefault(parse_prompt(p).category, []).append(s.strict)
    return EvalResult(
        score=float(np.mean([s.strict for s in scores])),
        partial=float(np.mean([s.partial for s in scores])),
        per_category={k: float(np.mean(v)) for k, v in sorted(by_cat.items())},
        per_criterion=criterion_means(scores),
        images=images_np if keep_images else None,
        prompts=all_prompts,
    )
