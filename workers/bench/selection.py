"""`spotlight bench selection`: how much reward contrast each seed strategy buys,
on checkpoint pairs of one training run.

The mechanism SPOTLIGHT relies on, measured without a learning curve. Along one training
run of a preset (random seeds), at each pair of weights (v_k, v_k+1) the bench samples a
fixed set of prompts x M candidate seeds: on the stale v_k with the full sampler and each
cheap level, and on the fresh v_k+1 with the full sampler (the rollout). Each strategy then
picks the G seeds per prompt it would train on, and is scored on the fresh rewards:

- `random`: the G default seeds (candidates 0..G-1);
- `wider_draw`: `wider_draw` x G seeds drawn on the fresh weights, the G of largest variance kept;
- `stale_<level>`: the G of largest stale variance among the M, at that level (`stale_none`: full sampler);
- `prefilter_<level>`: the W of largest stale variance, sampled fresh; the G of largest fresh variance kept;
- `planner`: the seed plan the coordinator makes with the configured arm (`plan_from_exploration`:
  W per contested prompt, G for a prompt whose stale rewards do not differ), then G kept of it;
- `fresh_oracle`: the G of largest fresh variance among all M (the most any selection can reach).

Per strategy: `variance_ratio`, the mean reward variance of the trained groups over the mean
variance of concurrent random groups (every disjoint block of G candidates on the same fresh
weights); `zero_std_share`, the share of trained groups whose rewards are all equal (GRPO learns
nothing from them); `rollout_cost`, samples drawn on the critical path per prompt over G.
Kendall tau-b of each stale level against the fresh full sampler, over all M candidates.
Every figure is the mean over pairs; `pairs` keeps each pair's.

Example:
    figures = run_selection_bench(SelectionBench(preset="cpu_tiny_hard", pairs_at=(0, 1)))
    figures["strategies"]["prefilter_half_steps"]["variance_ratio"], figures["kendall_tau"]
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

BENCH_ITERATION = 100_000
"""The prompt schedule's iteration whose prompts and candidate seeds the bench samples (no training run reaches it)."""
ZERO_STD = 1e-12


@dataclass(frozen=True)
class SelectionBench:
    """What the selection bench samples."""

    preset: str = "cpu_tiny_spot"
    """Training preset (workers/trainer/presets.py): model settings, reward, categories, group size G."""
    num_prompts: int = 16
    """Prompts sampled at every version."""
    num_candidates: int = 32
    """M: candidate seeds per prompt."""
    pairs_at: tuple[int, ...] = (0, 1, 2)
    """k of each pair (v_k, v_k+1); the run trains max(k) + 1 iterations."""
    levels: tuple[str, ...] = ("fbcache", "half_steps", "quarter_steps")
    """Cheap levels sampled on the stale weights (the full sampler, `none`, always is)."""
    keep_factor: float = 1.5
    """Pre-filter: W = round(keep_factor x G) seeds kept for the rollout."""
    wider_draw: int = 2
    """The wider draw's seeds per prompt, as a multiple of G."""
    planner_level: str = "half_steps"
    """The planner's arm: M candidates at this level, keeping W (`m32-half_steps-w12` for G = 8)."""
    seed: int = 0
    """Run seed of the training run (prompt schedule, seeds)."""

    def __post_init__(self) -> None:
        from workers.explore.request import cache_level
        from workers.trainer.presets import get_preset

        g = get_preset(self.preset).group_size
        if self.num_prompts < 1:
            raise ValueError(f"SelectionBench.num_prompts must be >= 1, got {self.num_prompts}")
        if not self.pairs_at or any(k < 0 for k in self.pairs_at) or len(set(self.pairs_at)) != len(self.pairs_at):
            raise ValueError(f"SelectionBench.pairs_at must be distinct iterations >= 0, got {self.pairs_at}")
        for name in (*self.levels, self.planner_level):
            cache_level(name)
        if self.planner_level != "none" and self.planner_level not in self.levels:
            raise ValueError(f"SelectionBench.planner_level {self.planner_level!r} must be one of levels {self.levels}")
        if not 1 <= self.keep_factor or round(self.keep_factor * g) > self.num_candidates:
            raise ValueError(
                f"SelectionBench.keep_factor must be >= 1 with W = round(keep_factor x G) <= num_candidates, "
                f"got {self.keep_factor} (G = {g}, M = {self.num_candidates})"
            )
        if self.wider_draw < 1 or self.wider_draw * g > self.num_candidates or self.num_candidates < 2 * g:
            raise ValueError(
                f"SelectionBench needs num_candidates >= 2 G and wider_draw x G <= num_candidates "
                f"(G = {g}), got num_candidates={self.num_candidates}, wider_draw={self.wider_draw}"
            )

    def train_config(self):
        from workers.trainer.presets import get_preset

        return dataclasses.replace(get_preset(self.preset), seed=self.seed, rollouts_per_prompt=None)

    @property
    def stale_levels(self) -> tuple[str, ...]:
        return ("none", *[lv for lv in self.levels if lv != "none"])


def run_selection_bench(bench: SelectionBench, policy=None, progress: Callable[[str], None] | None = None) -> dict:
    """Train along the preset, sample the pairs, score every strategy (see the module doc)."""
    from workers.model.tiny_policy import load_policy
    from workers.trainer.grpo_trainer import GRPOTrainer

    started = time.perf_counter()
    config = bench.train_config()
    policy = load_policy() if policy is None else policy
    trainer = GRPOTrainer(policy, config)
    say = progress or (lambda line: None)
    fresh: dict[int, np.ndarray] = {}
    stale: dict[int, dict[str, np.ndarray]] = {}
    needed = sorted({*bench.pairs_at, *(k + 1 for k in bench.pairs_at)})
    for v in range(needed[-1] + 1):
        if v in needed:
            fresh[v] = sample_rewards(policy, bench, config, "none")
        if v in bench.pairs_at:
            stale[v] = {
                "none": fresh[v],
                **{lv: sample_rewards(policy, bench, config, lv) for lv in bench.stale_levels if lv != "none"},
            }
        say(f"selection: weights v{v} sampled ({time.perf_counter() - started:.0f} s)")
        if v < needed[-1]:
            trainer.update(trainer.collect(v))  # the run trains on random seeds: v -> v+1
    pairs = [score_pair(k, stale[k], fresh[k + 1], bench, config) for k in bench.pairs_at]
    return {
        "strategies": _mean_strategies(pairs),
        "kendall_tau": _mean_tau(pairs),
        "pairs": pairs,
        "preset": bench.preset,
        "reward": config.reward,
        "group_size": config.group_size,
        "num_prompts": bench.num_prompts,
        "num_candidates": bench.num_candidates,
        "planner_arm": planner_arm(bench, config.group_size).name,
        "wall_s": round(time.perf_counter() - started, 1),
    }


def sample_rewards(policy, bench: SelectionBench, config, level: str) -> np.ndarray:
    """(prompts, M) rewards of the bench's candidates at `level` on the policy's current weights (the path an
    exploration request takes: `explore_rewards`, one batch per prompt)."""
    from workers.explore.request import ExploreSpec, explore_rewards

    rows = [
        explore_rewards(policy, ExploreSpec("bench", prompt, tuple(seeds), 0, config.sampler, level, config.reward))
        for prompt, seeds in zip(bench_prompts(bench, config), bench_candidates(bench, config), strict=False)
    ]
    return np.asarray(rows, dtype=np.float64)


def bench_prompts(bench: SelectionBench, config) -> list[str]:
    from workers.task.prompts import iteration_prompts

    return iteration_prompts(config.seed, BENCH_ITERATION, bench.num_prompts, config.train_categories)


def bench_candidates(bench: SelectionBench, config) -> list[list[int]]:
    from workers.algo.seeds import candidate_seeds

    return [
        candidate_seeds(config.seed, BENCH_ITERATION, i, config.group_size, bench.num_candidates)
        for i in range(bench.num_prompts)
    ]


def planner_arm(bench: SelectionBench, group_size: int):
    from workers.algo.bandit import Arm

    keep = round(bench.keep_factor * group_size)
    return Arm(bench.num_candidates, bench.planner_level, None if keep == group_size else keep)


def score_pair(k: int, stale: dict[str, np.ndarray], fresh: np.ndarray, bench: SelectionBench, config) -> dict:
    """Every strategy's trained groups on the pair (v_k, v_k+1), scored on the fresh rewards."""
    from workers.algo.rank_consistency import kendall_tau_b, mean_over_groups

    g = config.group_size
    w = round(bench.keep_factor * g)
    picks = strategy_picks(stale, fresh, g, w, bench.wider_draw)
    picks["planner"] = planner_picks(bench, config, stale[bench.planner_level])
    baseline = random_baseline(fresh, g)
    strategies = {name: score_strategy(fresh, drawn, g, baseline) for name, drawn in picks.items()}
    tau = {lv: mean_over_groups(kendall_tau_b, stale[lv].tolist(), fresh.tolist()) for lv in stale}
    return {
        "k": k,
        "random_variance": baseline,
        "strategies": strategies,
        "kendall_tau": {lv: None if t is None else round(t, 4) for lv, t in tau.items()},
    }


def strategy_picks(
    stale: dict[str, np.ndarray], fresh: np.ndarray, g: int, w: int, wider: int
) -> dict[str, list[list[int]]]:
    """Strategy -> per prompt, the candidate indices drawn on the fresh weights (the trained G are the max-variance
    G of them, `score_strategy`)."""
    from workers.algo.selection import select_max_variance

    m = fresh.shape[1]
    everyone = list(range(m))
    picks = {
        "random": [list(range(g)) for _ in fresh],
        "wider_draw": [list(range(wider * g)) for _ in fresh],
        "fresh_oracle": [everyone for _ in fresh],
    }
    for lv, rewards in stale.items():
        picks[f"stale_{lv}"] = [select_max_variance(everyone, row.tolist(), g) for row in rewards]
        if w > g:
            picks[f"prefilter_{lv}"] = [select_max_variance(everyone, row.tolist(), w) for row in rewards]
    return picks


def planner_picks(bench: SelectionBench, config, stale: np.ndarray) -> list[list[int]]:
    """Candidate indices of the seed plan the coordinator makes from `stale` with the planner's arm."""
    from workers.explore.seed_plan import plan_from_exploration
    from workers.explore.state import ExploreConfig

    arm = planner_arm(bench, config.group_size)
    candidates = bench_candidates(bench, config)
    plan_config = dataclasses.replace(config, prompts_per_iteration=bench.num_prompts)
    explored = {i: (seeds, row.tolist()) for i, (seeds, row) in enumerate(zip(candidates, stale, strict=False))}
    plan = plan_from_exploration(
        plan_config,
        BENCH_ITERATION,
        explored,
        f"explore:{arm.name}",
        keep=arm.kept(config.group_size),
        min_contest_std=ExploreConfig().min_contest_std,
    )
    return [[seeds.index(s) for s in group] for seeds, group in zip(candidates, plan.seeds, strict=False)]


def random_baseline(fresh: np.ndarray, g: int) -> float:
    """Mean reward variance of random groups on the fresh weights: every disjoint block of G candidates."""
    blocks = [np.var(row[b * g : (b + 1) * g]) for row in fresh for b in range(fresh.shape[1] // g)]
    return float(np.mean(blocks))


def score_strategy(fresh: np.ndarray, drawn: list[list[int]], g: int, baseline: float) -> dict:
    """variance_ratio, zero_std_share and rollout_cost of a strategy
    that draws `drawn` and trains the max-variance G."""
    from workers.explore.state import trained_variance

    variances = [trained_variance([float(row[j]) for j in idx], g) for row, idx in zip(fresh, drawn, strict=False)]
    ratio = float(np.mean(variances)) / baseline if baseline > ZERO_STD else None
    return {
        "variance_ratio": None if ratio is None else round(ratio, 4),
        "zero_std_share": round(float(np.mean([v <= ZERO_STD for v in variances])), 4),
        "rollout_cost": round(float(np.mean([len(idx) for idx in drawn])) / g, 4),
    }


def _mean_strategies(pairs: list[dict]) -> dict:
    out = {}
    for name in pairs[0]["strategies"]:
        out[name] = {}
        for field in ("variance_ratio", "zero_std_share", "rollout_cost"):
            values = [p["strategies"][name][field] for p in pairs if p["strategies"][name][field] is not None]
            out[name][field] = round(float(np.mean(values)), 4) if values else None
    return out


def _mean_tau(pairs: list[dict]) -> dict:
    out = {}
    for lv in pairs[0]["kendall_tau"]:
        values = [p["kendall_tau"][lv] for p in pairs if p["kendall_tau"][lv] is not None]
        out[lv] = round(float(np.mean(values)), 4) if values else None
    return out


def selection_text(figures: dict) -> str:
    """The figures as a table."""
    lines = [
        f"{figures['preset']} ({figures['reward']}), {figures['num_prompts']} prompts x {figures['num_candidates']} "
        f"candidates, G = {figures['group_size']}, pairs k = {[p['k'] for p in figures['pairs']]}, "
        f"planner {figures['planner_arm']}, {figures['wall_s']} s",
        f"{'strategy':>22}  {'variance_ratio':>14}  {'zero_std_share':>14}  {'rollout_cost':>12}",
    ]
    for name, s in figures["strategies"].items():
        lines.append(
            f"{name:>22}  {_fmt(s['variance_ratio']):>14}  {_fmt(s['zero_std_share']):>14}  "
            f"{_fmt(s['rollout_cost']):>12}"
        )
    lines.append(
        "kendall tau (stale level vs fresh full sampler): "
        + ", ".join(f"{lv} {_fmt(t)}" for lv, t in figures["kendall_tau"].items())
    )
    return "\n".join(lines)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"
