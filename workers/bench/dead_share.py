"""`spotlight bench dead-share`: how often a random group of G seeds is dead (every reward equal) on a task, and how
often a group picked from M candidates still is: the headroom seed selection has before any training run.

For the training prompts of a few iterations (the preset's prompt schedule), M candidate seeds per prompt are
sampled with the rollout's sampler on one set of weights and scored with the preset's reward. Every disjoint block
of G candidates is a random group (the first block is the group a run samples); the picked group is the G of
largest reward variance among the M (`select_max_variance`, what exploration's plan keeps, here without
staleness). Below 30 % of random groups dead, the headline design has little to gain (docs/EXPLORATION.md).

Example:
    figures = dead_share(load_policy(), get_preset("cpu_tiny_lowpass"), iterations=4, num_candidates=16)
    figures["random_dead_share"], figures["picked_dead_share"], figures["per_category"]["position"]
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from workers.algo.seeds import candidate_seeds
from workers.algo.selection import select_max_variance
from workers.task.prompt_file import train_prompts
from workers.task.prompts import parse_prompt
from workers.trainer.grpo_trainer import TrainConfig


def _rewards(policy, prompt: str, seeds: list[int], config: TrainConfig) -> list[float]:
    from workers.algo.sampler import rollout
    from workers.task.render import to_uint8
    from workers.task.rewards import get_reward

    traj = rollout(policy, [prompt] * len(seeds), seeds, config.sampler)
    return [float(r) for r in get_reward(config.reward)(to_uint8(traj.images), [prompt] * len(seeds))]


def _dead(group: list[float]) -> bool:
    return float(np.ptp(group)) < 1e-9


def dead_share(
    policy,
    config: TrainConfig,
    iterations: int,
    num_candidates: int,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Dead-group shares of random and picked groups of `config.group_size`, overall and per category."""
    g = config.group_size
    if iterations < 1 or num_candidates < 2 * g:
        raise ValueError(
            f"iterations must be >= 1 and num_candidates >= 2 x G = {2 * g}, got {iterations}, {num_candidates}"
        )
    per_category: dict[str, dict[str, list]] = {}
    for k in range(1, iterations + 1):
        for i, prompt in enumerate(train_prompts(config, k)):
            rewards = _rewards(policy, prompt, candidate_seeds(config.seed, k, i, g, num_candidates), config)
            blocks = [rewards[n : n + g] for n in range(0, num_candidates - g + 1, g)]
            picked = [rewards[j] for j in select_max_variance(list(range(num_candidates)), rewards, g)]
            cat = per_category.setdefault(parse_prompt(prompt).category, {"random": [], "picked": [], "pass": []})
            cat["random"] += [_dead(b) for b in blocks]
            cat["picked"].append(_dead(picked))
            cat["pass"] += rewards
        if progress is not None:
            progress(f"dead share: iteration {k}/{iterations} of prompts sampled")
    every = {name: [x for c in per_category.values() for x in c[name]] for name in ("random", "picked", "pass")}
    return {
        "reward": config.reward,
        "group_size": g,
        "num_candidates": num_candidates,
        "num_prompts": len(every["picked"]),
        "random_dead_share": _share(every["random"]),
        "random_dead_share_se": _se(every["random"]),
        "picked_dead_share": _share(every["picked"]),
        "mean_reward": _share(every["pass"]),
        "per_category": {
            name: {
                "prompts": len(c["picked"]),
                "mean_reward": _share(c["pass"]),
                "random_dead_share": _share(c["random"]),
                "picked_dead_share": _share(c["picked"]),
            }
            for name, c in sorted(per_category.items())
        },
    }


def _share(values: list) -> float:
    return round(float(np.mean(values)), 4) if values else float("nan")


def _se(values: list) -> float:
    """Binomial standard error (blocks of one prompt are correlated: a lower bound)."""
    p = float(np.mean(values))
    return round((p * (1 - p) / len(values)) ** 0.5, 4)


def dead_share_text(figures: dict) -> str:
    lines = [
        f"{figures['reward']}, G = {figures['group_size']}, {figures['num_prompts']} prompts x "
        f"{figures['num_candidates']} candidates: random groups dead {figures['random_dead_share']:.1%} "
        f"(SE {figures['random_dead_share_se']:.1%}), picked groups dead {figures['picked_dead_share']:.1%}, "
        f"mean reward {figures['mean_reward']:.3f}"
    ]
    for name, c in figures["per_category"].items():
        lines.append(
            f"  {name:>18}: {c['prompts']} prompts, mean {c['mean_reward']:.3f}, random dead "
            f"{c['random_dead_share']:.1%}, picked dead {c['picked_dead_share']:.1%}"
        )
    return "\n".join(lines)
