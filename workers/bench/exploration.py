"""`spotlight bench exploration`: does seed exploration on stale weights reach a held-out target sooner, at what overhead?

Two parts, both on the default preset from the shipped base:

1. Static (`workers/bench/exploration_static.py`): each cache level's cost and rank
   fidelity against the full sampler on one set of weights, and what choosing seeds with it
   does to group reward std and the zero-std share, with the dense and the strict reward.
2. Training (`workers/bench/exploration_run.py`): per run seed, three pipeline runs (the
   coordinator's phases, rollout workers pulling from a queue) with the same prompts and
   workers: random seeds, exploration (bandit-planned, on stale weights, beside training)
   and best-of-N on the critical path. Figures: iterations and critical-path wall seconds
   to the target held-out score, mean group reward std and zero-std ratio, exploration
   overhead as a share of iteration time, rank consistency (the monitor's, on planned
   seeds, and an audit on all candidates of a few prompts).

Example:
    figures = run_exploration_bench(ExplorationBench(seeds=(0, 1, 2)), progress=print)
    figures["time_to_target_speedup"], figures["exploration_overhead_pct"], figures["kendall_tau"]
"""

from __future__ import annotations

import dataclasses
import math
import platform
import statistics
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from workers.bench.exploration_run import STRATEGIES, run_strategy


@dataclass(frozen=True)
class ExplorationBench:
    """What the benchmark runs; `quick()` is a smoke-sized version for tests."""

    preset: str = "cpu_tiny"
    """Training preset (the default recipe)."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """Run seeds: prompt schedule and default request seeds."""
    iterations: int = 6
    """Training iterations per run (the preset's are more than this machine can afford 9 times)."""
    validate_every: int = 3
    target_gain: float = 0.03
    """Target held-out score = base score + this (the recipe's mean gain over 10 iterations, docs/RECIPE.md)."""
    num_workers: int = 1
    """Rollout worker processes (one torch thread each): they sample the rollouts and explore beside the
    trainer; one, as much spot capacity as the trainer has (conservative)."""
    seed_multipliers: tuple[int, ...] = (2, 3)
    cache_levels: tuple[str, ...] = ("fbcache", "half_steps", "quarter_steps")
    best_of_n: int = 2
    """Best-of-N samples N = best_of_n x G seeds per prompt."""
    audit_prompts: int = 1
    """Prompts per iteration whose every candidate is also scored on fresh weights (rank-consistency audit)."""
    static_iterations: int = 1
    """Iterations of prompts in the static part (each: P prompts x 2G candidates x every level)."""
    train_overrides: dict = field(default_factory=dict)
    """TrainConfig fields replaced after the preset (quick mode shrinks the batch)."""
    strategies: tuple[str, ...] = STRATEGIES
    """Which training runs to make (all three for the comparison; a subset to rerun one under other settings)."""

    def __post_init__(self) -> None:
        from workers.trainer.presets import get_preset

        if len(self.seeds) < 1 or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds}")
        for name in ("iterations", "validate_every", "num_workers", "best_of_n", "static_iterations"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.audit_prompts < 0 or not self.target_gain > 0:
            raise ValueError("audit_prompts must be >= 0 and target_gain > 0")
        if not self.strategies or set(self.strategies) - set(STRATEGIES):
            raise ValueError(f"strategies must be a non-empty subset of {STRATEGIES}, got {self.strategies}")
        get_preset(self.preset)  # an unknown preset fails here, before any compute
        self.explore_config()

    @classmethod
    def quick(cls) -> "ExplorationBench":
        """Two tiny iterations of one seed: checks the whole benchmark runs, in about a minute."""
        from workers.algo.sampler import SamplerConfig

        return cls(seeds=(0,), iterations=2, validate_every=1, static_iterations=1,
                   train_overrides={"prompts_per_iteration": 2, "group_size": 4, "validation_seeds": 1,
                                    "sampler": SamplerConfig(num_steps=4, noise_level=0.0)})

    def train_config(self):
        from workers.trainer.presets import get_preset

        config = get_preset(self.preset)
        # The strategies differ only in how the group_size seeds of a prompt are chosen; a preset's
        # wider draw (rollouts_per_prompt) is best_of_n's own and is left to it.
        return dataclasses.replace(config, iterations=self.iterations, rollouts_per_prompt=None, **self.train_overrides)

    def explore_config(self):
        from workers.explore.state import ExploreConfig

        return ExploreConfig(seed_multipliers=self.seed_multipliers, cache_levels=self.cache_levels, num_workers=self.num_workers)


def run_exploration_bench(bench: ExplorationBench, checkpoint=None, progress: Callable[[dict], None] | None = None) -> dict:
    """Both parts; returns plain JSON figures (names in docs/EXPLORATION.md)."""
    from workers.bench.exploration_static import static_selection
    from workers.model.policy import SHIPPED_BASE, load_policy

    torch.set_num_threads(1)  # the trainer's one thread beside one-thread workers: no core oversubscribed
    checkpoint = checkpoint or SHIPPED_BASE
    config, explore_config = bench.train_config(), bench.explore_config()
    say = progress or (lambda record: None)
    static = static_selection(load_policy(checkpoint), config, bench.static_iterations,
                              bench.seed_multipliers[0] * config.group_size, bench.cache_levels,
                              progress=lambda text: say({"stage": text}))
    runs = [run_strategy(s, seed, config, explore_config, checkpoint=checkpoint, num_workers=bench.num_workers,
                         validate_every=bench.validate_every, best_of_n=bench.best_of_n,
                         audit_prompts=bench.audit_prompts, progress=say)
            for seed in bench.seeds for s in STRATEGIES if s in bench.strategies]
    base_score = runs[0]["curve"][0]["score"]  # every run validates the same weights version 0 first
    target = base_score + bench.target_gain
    figures = summarize(runs, target, config.prompts_per_iteration)
    return {"preset": bench.preset, "num_seeds": len(bench.seeds), "seeds": list(bench.seeds),
            "iterations": bench.iterations, "num_workers": bench.num_workers, "base_score": base_score,
            "target_score": round(target, 6), **figures, "static": static,
            "arms": [a.name for a in explore_config.arms(config.group_size)],
            "torch_threads": torch.get_num_threads(),
            "clock": "wall seconds: trainer one thread, rollout workers one thread each, in their own processes",
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "runs": runs}


def time_to_target(run: dict, target: float) -> tuple[int | None, float | None]:
    """(weights version, critical-path seconds) of the first validation at or above the target."""
    for point in run["curve"][1:]:
        if point["score"] >= target:
            return point["version"], point["critical_s"]
    return None, None


def summarize(runs: list[dict], target: float, num_prompts: int) -> dict:
    """Per-strategy means over seeds, and the headline figures exploration is judged by."""
    per: dict[str, dict] = {}
    for strategy in sorted({r["strategy"] for r in runs}, key=STRATEGIES.index):
        mine = [r for r in runs if r["strategy"] == strategy]
        reached = [time_to_target(r, target) for r in mine]
        rows = [row for r in mine for row in r["iterations"] if row["iteration"] >= 1]  # iteration 0 is random for all
        per[strategy] = {
            "reached_target": sum(v is not None for v, _ in reached),
            "iterations_to_target": _mean([v for v, _ in reached if v is not None]),
            "critical_s_to_target": _mean([s for _, s in reached if s is not None]),
            "final_score": _mean([r["curve"][-1]["score"] for r in mine]),
            "best_score": _mean([max(p["score"] for p in r["curve"][1:]) for r in mine]),
            "reward_std": _mean([row["reward_std"] for row in rows]),
            "zero_std_ratio": _mean([row["zero_std_ratio"] for row in rows]),
            "critical_s_per_iteration": _mean([_critical(row) for r in mine for row in r["iterations"]]),
        }
    explore_rows = [row for r in runs if r["strategy"] == "explore" for row in r["iterations"]]
    overhead = sum(row["overhead_s"] for row in explore_rows)
    critical = sum(_critical(row) for row in explore_rows)
    audit = [a for row in explore_rows for a in row.get("audit", [])]
    return {
        "strategies": per,
        "time_to_target_speedup": _speedup(runs, target, "random", "explore"),
        "time_to_target_speedup_vs_best_of_n": _speedup(runs, target, "best_of_n", "explore"),
        "reward_std_ratio": _ratio(per.get("explore", {}).get("reward_std"), per.get("random", {}).get("reward_std")),
        "exploration_overhead_pct": round(100 * overhead / critical, 4) if critical else None,
        "exploration_overhead_s_per_iteration": round(overhead / max(len(explore_rows), 1), 6),
        "explored_prompt_share": _mean([row["explored_prompts"] / num_prompts for row in explore_rows if row.get("arm")]),
        "budget_use_pct": round(100 * sum(row.get("explore_wall_s", 0.0) for row in explore_rows)
                                / max(sum(row["train_s"] for row in explore_rows), 1e-9), 2),
        "kendall_tau": _distribution([row.get("kendall_tau") for row in explore_rows]),
        "spearman_rho": _distribution([row.get("spearman_rho") for row in explore_rows]),
        "kendall_tau_audit": _distribution([a["kendall_tau"] for a in audit]),
        "spearman_rho_audit": _distribution([a["spearman_rho"] for a in audit]),
        "variance_gain": _distribution([row.get("variance_gain") for row in explore_rows]),
        "fallback_iterations": sum(row["planner"].startswith("random:fallback") for row in explore_rows),
        "arms_chosen": _counts([row.get("arm") for row in explore_rows]),
    }


def _critical(row: dict) -> float:
    """An iteration's critical-path seconds: what the trainer waited for."""
    return row["sync_s"] + row["rollout_s"] + row["train_s"] + row["overhead_s"]


def _speedup(runs: list[dict], target: float, slow: str, fast: str) -> float | None:
    """Mean over seeds where both reached the target of slow / fast critical-path seconds to it."""
    ratios = []
    for seed in sorted({r["seed"] for r in runs}):
        pair = [next((r for r in runs if r["seed"] == seed and r["strategy"] == s), None) for s in (slow, fast)]
        if None in pair:
            continue
        a, b = (time_to_target(r, target)[1] for r in pair)
        if a is not None and b:
            ratios.append(a / b)
    return _mean(ratios)


def _distribution(values: list) -> dict:
    clean = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not clean:
        return {"n": 0, "mean": None, "p10": None, "median": None, "p90": None}
    q = np.quantile(clean, [0.1, 0.5, 0.9])
    return {"n": len(clean), "mean": round(statistics.mean(clean), 4), "p10": round(float(q[0]), 4),
            "median": round(float(q[1]), 4), "p90": round(float(q[2]), 4)}


def _counts(values: list) -> dict:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def _mean(values: list) -> float | None:
    clean = [v for v in values if v is not None]
    return round(statistics.mean(clean), 6) if clean else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 4)


def format_exploration_report(figures: dict) -> str:
    """The headline figures as text (the CLI without --json)."""
    lines = [f"base held-out {figures['base_score']:.3f}, target {figures['target_score']:.3f}, "
             f"{figures['num_seeds']} seeds x {figures['iterations']} iterations, {figures['num_workers']} exploration worker(s)",
             f"{'strategy':>10} {'reached':>7} {'its':>5} {'crit s':>8} {'final':>6} {'std':>6} {'zero-std':>8} {'s/it':>6}"]
    for name, s in figures["strategies"].items():
        lines.append(f"{name:>10} {s['reached_target']:>7} {_fmt(s['iterations_to_target']):>5} {_fmt(s['critical_s_to_target']):>8} "
                     f"{_fmt(s['final_score']):>6} {_fmt(s['reward_std']):>6} {_fmt(s['zero_std_ratio']):>8} "
                     f"{_fmt(s['critical_s_per_iteration']):>6}")
    for key in ("time_to_target_speedup", "time_to_target_speedup_vs_best_of_n", "reward_std_ratio",
                "exploration_overhead_pct", "explored_prompt_share", "budget_use_pct", "fallback_iterations"):
        lines.append(f"{key:>36}: {figures[key]}")
    for key in ("kendall_tau", "spearman_rho", "kendall_tau_audit", "variance_gain"):
        lines.append(f"{key:>36}: {figures[key]}")
    lines.append(f"{'arms_chosen':>36}: {figures['arms_chosen']}")
    for level, f in figures["static"]["levels"].items():
        lines.append(f"{'static ' + level:>36}: {f}")
    return "\n".join(lines)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)
