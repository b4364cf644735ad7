"""Held-out validation: fixed prompts, fixed seeds, deterministic ODE sampling, scored by MiniGenEval's detector
(GenEval-style) or by any reward.

Fixed seeds and the ODE remove sampling noise from the comparison between checkpoints,
so a change in score is a change in the policy. Which one a run uses: workers/task/validation.py.

Example:
    result = evaluate(policy, split_prompts()["heldout"])
    result.score, result.per_category, result.per_criterion
    result = evaluate_reward(policy, prompts, "clip:/models/PickScore_v1", 2, train_config.sampler)
    result.score, result.scores                     # mean PickScore; per image
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from workers.algo.sampler import SamplerConfig, rollout
from workers.task.detector import criterion_means, score_images
from workers.task.prompt_file import prompt_fields
from workers.task.prompts import parse_prompt
from workers.task.render import decode_images
from workers.task.rewards import get_reward, score_with_components

VALIDATION_SEED_BASE = 1_000_000
"""Validation seeds are VALIDATION_SEED_BASE + k: disjoint from training seeds."""


@dataclass
class EvalResult:
    score: float
    """Share of images that satisfy every criterion of their prompt (GenEval's overall)."""
    partial: float | None
    """Mean share of criteria satisfied (None when a reward scored the images)."""
    per_category: dict[str, float] = field(default_factory=dict)
    per_criterion: dict[str, float] = field(default_factory=dict)
    """The detector's criteria; for a reward, `reward/<name>` per component of a multi-reward."""
    images: np.ndarray | None = None
    """uint8 (N, H, W, 3), in prompt-major order."""
    prompts: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    """Each image's score, prompt-major (a reward's value; the detector's strict 0/1)."""


REWARD_BATCH_SIZE = 8
"""Images per sampling batch when a reward scores them (a diffusers pipeline at 512 px and more)."""


def _sample(
    policy, prompts: list[str], seeds_per_prompt: int, config: SamplerConfig, batch_size: int
) -> tuple[list[str], np.ndarray]:
    """Every prompt x fixed seed, prompt-major, in batches of `batch_size`: (prompts, uint8 images)."""
    if seeds_per_prompt < 1:
        raise ValueError(f"seeds_per_prompt must be >= 1, got {seeds_per_prompt}")
    all_prompts = [p for p in prompts for _ in range(seeds_per_prompt)]
    seeds = [VALIDATION_SEED_BASE + k for k in range(seeds_per_prompt)] * len(prompts)
    images = []
    for i in range(0, len(all_prompts), batch_size):
        traj = rollout(policy, all_prompts[i : i + batch_size], seeds[i : i + batch_size], config)
        images.append(decode_images(policy, traj.images))
    return all_prompts, np.concatenate(images)


def evaluate(
    policy,
    prompts: list[str],
    seeds_per_prompt: int = 2,
    num_steps: int = 8,
    batch_size: int = 64,
    keep_images: bool = False,
) -> EvalResult:
    """Score the policy on prompts x fixed seeds with the ODE sampler and MiniGenEval's detector."""
    config = SamplerConfig(num_steps=num_steps, noise_level=0.0)
    all_prompts, images_np = _sample(policy, prompts, seeds_per_prompt, config, batch_size)
    scores = score_images(images_np, all_prompts)
    return EvalResult(
        score=float(np.mean([s.strict for s in scores])),
        partial=float(np.mean([s.partial for s in scores])),
        per_category=_category_means(all_prompts, [s.strict for s in scores]),
        per_criterion=criterion_means(scores),
        images=images_np if keep_images else None,
        prompts=all_prompts,
        scores=[float(s.strict) for s in scores],
    )


def evaluate_reward(
    policy,
    prompts: list[str],
    reward: str,
    seeds_per_prompt: int,
    sampler: SamplerConfig,
    batch_size: int = REWARD_BATCH_SIZE,
    keep_images: bool = False,
    fields=None,
) -> EvalResult:
    """Score the policy on prompts x fixed seeds with `reward`, sampling as the run does (its steps, shift and
    dtype) but as an ODE; `fields` (a PromptSource) hands each prompt's fields to the reward. The score is the
    reward's mean over every image; a multi-reward's components are reported as `reward/<name>`, and
    MiniGenEval prompts also give a mean per category."""
    config = dataclasses.replace(sampler, noise_level=0.0, sde_window=None)
    all_prompts, images_np = _sample(policy, prompts, seeds_per_prompt, config, batch_size)

    per_image = None if fields is None else [prompt_fields(fields, p) for p in all_prompts]
    totals, parts = score_with_components(get_reward(reward), images_np, all_prompts, per_image)
    return EvalResult(
        score=float(np.mean(totals)),
        partial=None,
        per_category=_category_means(all_prompts, totals),
        per_criterion={f"reward/{name}": float(np.mean(v)) for name, v in parts.items()},
        images=images_np if keep_images else None,
        prompts=all_prompts,
        scores=[float(t) for t in totals],
    )


def _category_means(prompts: list[str], scores) -> dict[str, float]:
    """Mean score per MiniGenEval category; {} unless every prompt is a MiniGenEval prompt."""
    by_cat: dict[str, list[float]] = {}
    for p, s in zip(prompts, scores, strict=False):
        try:
            category = parse_prompt(p).category
        except ValueError:
            return {}
        by_cat.setdefault(category, []).append(float(s))
    return {k: float(np.mean(v)) for k, v in sorted(by_cat.items())}
