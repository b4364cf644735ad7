"""`spotlight bench exploration`, part 1: what each cheap-sampler level costs and how well it ranks seeds,
on one set of weights.

For the prompts of a few iterations, every candidate seed is sampled with the full rollout
sampler and with each cache level, on the same weights (no staleness: this isolates the
cheap sampler). For each level: its cost relative to the full sampler (CPU seconds), the
rank agreement of its rewards with the full ones (Kendall tau-b, Spearman rho, per prompt),
and, for each reward (the dense default and the all-or-nothing `minigeneval_strict`), the
real reward std and zero-std share of groups chosen from its rewards against random
groups (the default seeds).

Example:
    figures = static_selection(load_policy(), get_preset("cpu_tiny"), iterations=2, num_candidates=16)
    figures["levels"]["half_steps"]["cost_ratio"], figures["selection"]["minigeneval_strict"]
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from workers.algo.rank_consistency import kendall_tau_b, mean_over_groups, spearman_rho
from workers.algo.seeds import candidate_seeds
from workers.algo.selection import select_max_variance
from workers.explore.request import CACHE_LEVELS, cache_hooks
from workers.task.prompt_file import train_prompts
from workers.trainer.grpo_trainer import TrainConfig

REWARDS = ("minigeneval", "minigeneval_strict")


def _sample_rewards(
    policy, prompt: str, seeds: list[int], level_name: str | None, config: TrainConfig
) -> tuple[dict, float]:
    """Rewards under every reward of REWARDS for one prompt's seeds, and the CPU seconds it took."""
    from workers.algo.sampler import rollout
    from workers.task.render import to_uint8
    from workers.task.rewards import get_reward

    started = time.process_time()
    prompts = [prompt] * len(seeds)
    if level_name is None:
        traj = rollout(policy, prompts, seeds, config.sampler)
    else:
        level = CACHE_LEVELS[level_name]
        with cache_hooks(policy.transformer, level):
            traj = rollout(policy, prompts, seeds, level.sampler(config.sampler))
    images = to_uint8(traj.images)
    out = {name: [float(r) for r in get_reward(name)(images, prompts)] for name in REWARDS}
    return out, time.process_time() - started


def _group_stats(groups: list[list[float]]) -> dict:
    stds = [float(np.std(g)) for g in groups]
    return {
        "reward_std": round(float(np.mean(stds)), 6),
        "zero_std_ratio": round(float(np.mean([s < 1e-8 for s in stds])), 6),
    }


def static_selection(
    policy,
    config: TrainConfig,
    iterations: int,
    num_candidates: int,
    levels: tuple[str, ...] = tuple(CACHE_LEVELS),
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Cost and fidelity of each cache level, and the effect of selecting seeds with it (see the module doc)."""
    g = config.group_size
    full: dict[str, list[list[float]]] = {name: [] for name in REWARDS}
    cheap = {lv: {name: [] for name in REWARDS} for lv in levels}
    seconds = {None: 0.0, **{lv: 0.0 for lv in levels}}
    for k in range(1, iterations + 1):
        for i, prompt in enumerate(train_prompts(config, k)):
            seeds = candidate_seeds(config.seed, k, i, g, num_candidates)
            for lv in (None, *levels):
                rewards, spent = _sample_rewards(policy, prompt, seeds, lv, config)
                seconds[lv] += spent
                for name in REWARDS:
                    (full if lv is None else cheap[lv])[name].append(rewards[name])
        if progress is not None:
            progress(f"static selection: iteration {k}/{iterations} of prompts sampled")
    out_levels, selection = {}, {name: {"random": _group_stats([r[:g] for r in full[name]])} for name in REWARDS}
    for lv in levels:
        out_levels[lv] = {"cost_ratio": round(seconds[lv] / seconds[None], 4)}
        for name in REWARDS:
            out_levels[lv][f"kendall_tau_{name}"] = _round(mean_over_groups(kendall_tau_b, cheap[lv][name], full[name]))
            out_levels[lv][f"spearman_rho_{name}"] = _round(mean_over_groups(spearman_rho, cheap[lv][name], full[name]))
            chosen = [
                [real[j] for j in select_max_variance(list(range(len(real))), est, g)]
                for est, real in zip(cheap[lv][name], full[name], strict=False)
            ]
            selection[name][lv] = _group_stats(chosen)
    oracle = {
        name: _group_stats(
            [[real[j] for j in select_max_variance(list(range(len(real))), real, g)] for real in full[name]]
        )
        for name in REWARDS
    }
    for name in REWARDS:
        selection[name]["full_sampler_same_weights"] = oracle[name]
    return {
        "num_prompts": len(full[REWARDS[0]]),
        "num_candidates": num_candidates,
        "group_size": g,
        "full_sampler_s_per_prompt": round(seconds[None] / max(len(full[REWARDS[0]]), 1), 4),
        "levels": out_levels,
        "selection": selection,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
