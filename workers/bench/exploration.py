"""`spotlight bench exploration`: does seed exploration on stale weights reach a held-out target sooner,
and at what cost?

SPOTLIGHT's time to target is the product of two factors, measured apart here:

1. **Learning** (workers/bench/exploration_learning.py): iterations to the target, from
   real training runs per strategy and run seed with the same prompt schedule: random
   seeds, exploration off the critical path on a budget counted in samples, and the wider
   draw on the critical path. The runs are deterministic, so they go in parallel
   processes, and each record is kept in `out/` (a rerun reuses it).
2. **Seconds** (workers/bench/exploration_run.py): critical-path wall seconds per
   iteration and per phase, from short runs of each strategy on the pipeline's queue path
   (rollout worker processes pulling from a SQLite queue, exploring beside training).

Also (workers/bench/exploration_static.py) each cache level's cost and rank fidelity on
one set of weights. The figures and their intervals: workers/bench/exploration_summary.py.

Example:
    figures = run_exploration_bench(ExplorationBench(seeds=(0, 1, 2)), out=Path("runs/bench-explore"))
    figures["time_to_target_speedup"], figures["time_to_target_speedup_interval"]
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import platform
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from workers.bench.exploration_learning import STRATEGIES, LearningRun, learning_run, with_base_reading
from workers.bench.exploration_summary import (
    per_seed_to_target,
    summarize_learning,
    summarize_timing,
    time_to_target,
    timing_from_learning,
)


@dataclass(frozen=True)
class ExplorationBench:
    """What the benchmark runs; `quick()` is a smoke-sized version for tests."""

    preset: str = "cpu_tiny_spot"
    """Training preset: `spotlight run`'s default, whose contrast comes from exploration."""
    seeds: tuple[int, ...] = tuple(range(8))
    """Run seeds: prompt schedule and default request seeds, shared by every strategy."""
    iterations: int | None = None
    """Training iterations per learning run (None: the preset's)."""
    validate_every: int = 5
    target_gain: float = 0.08
    """The headline target: the base held-out score + this."""
    other_target_gains: tuple[float, ...] = (0.04, 0.06, 0.10)
    """Further targets the ratios are also reported at (how the answer depends on the target)."""
    explore_samples: float = 128.0
    """Exploration's budget per iteration in full-sampler samples: two rollouts' worth, about what the demo's two
    spot workers explored beside a 14 s update (docs/BENCHMARKS.md)."""
    wider_draw: int = 2
    """wider_draw: seeds drawn per prompt on the critical path, as a multiple of the group size."""
    seed_multipliers: tuple[int, ...] = (2, 3, 4)
    cache_levels: tuple[str, ...] = ("fbcache", "half_steps", "quarter_steps")
    keep_factors: tuple[float, ...] = (1.0,)
    """Explore's arms keep W = f x G seeds per prompt for the rollout (1.0: the plan is the final pick; 1.5: a
    pre-filter, the rollout samples 1.5 G on fresh weights and trains the G of largest variance)."""
    control_prompts: int = 0
    """Explore: prompts per iteration kept on random seeds as a concurrent control (the bandit's baseline)."""
    min_arm_tau: float | None = None
    """Explore: the bandit drops an arm whose mean measured Kendall tau is below this (None: no floor)."""
    timing_iterations: int = 3
    """Iterations of each strategy's pipeline run that measures critical-path seconds (0: no timing runs)."""
    num_workers: int = 2
    """Rollout worker processes of the timing runs (one torch thread each)."""
    jobs: int = 1
    """Learning runs at once, one process and one torch thread each."""
    static_iterations: int = 1
    """Iterations of prompts in the static part (each: P prompts x 2G candidates x every level; 0: no static part)."""
    audit_prompts: int = 1
    """Timing runs: prompts per iteration whose every candidate is also scored on fresh weights."""
    resamples: int = 2000
    """Bootstrap resamples of run seeds behind every interval."""
    train_overrides: dict = field(default_factory=dict)
    """TrainConfig fields replaced after the preset (quick mode shrinks the batch)."""
    strategies: tuple[str, ...] = ("random", "explore", "wider_draw")
    """The strategies run (random_wide, R_2G, on request: it costs twice random's rollout and update)."""
    shared_base_reading: bool = False
    """Only the first run scores weights version 0, the others reuse its reading (every run reads the same base):
    saves a held-out reading per run where readings are large (512 images)."""

    def __post_init__(self) -> None:
        from workers.trainer.presets import get_preset

        if len(self.seeds) < 1 or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds}")
        if self.static_iterations < 0:
            raise ValueError(f"static_iterations must be >= 0, got {self.static_iterations}")
        for name in ("validate_every", "num_workers", "jobs", "resamples"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.iterations is not None and self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if self.timing_iterations < 0 or self.audit_prompts < 0 or self.wider_draw < 2:
            raise ValueError("timing_iterations and audit_prompts must be >= 0, wider_draw >= 2")
        for name in ("target_gain", "explore_samples"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not self.strategies or set(self.strategies) - set(STRATEGIES):
            raise ValueError(f"strategies must be a non-empty subset of {STRATEGIES}, got {self.strategies}")
        get_preset(self.preset)  # an unknown preset fails here, before any compute
        self.explore_config()

    @classmethod
    def quick(cls) -> "ExplorationBench":
        """Two tiny iterations of one seed: checks the whole benchmark runs, in a minute or two."""
        from workers.algo.sampler import SamplerConfig

        return cls(
            seeds=(0,),
            iterations=2,
            validate_every=1,
            static_iterations=1,
            timing_iterations=1,
            explore_samples=16.0,
            resamples=50,
            train_overrides={
                "prompts_per_iteration": 2,
                "group_size": 4,
                "validation_seeds": 1,
                "sampler": SamplerConfig(num_steps=4, noise_level=0.0),
            },
        )

    def train_config(self):
        """The preset with the bench's iterations and overrides; every strategy's own change comes on top."""
        from workers.trainer.presets import get_preset

        config = get_preset(self.preset)
        changes = {"validate_every": self.validate_every, "rollouts_per_prompt": None, **self.train_overrides}
        if self.iterations is not None:
            changes["iterations"] = self.iterations
        return dataclasses.replace(config, **changes)

    def explore_config(self):
        from workers.algo.bandit import BanditConfig
        from workers.explore.state import ExploreConfig

        return ExploreConfig(
            seed_multipliers=self.seed_multipliers,
            cache_levels=self.cache_levels,
            num_workers=self.num_workers,
            keep_factors=self.keep_factors,
            control_prompts=self.control_prompts,
            bandit=BanditConfig(min_arm_tau=self.min_arm_tau),
        )

    def differs_from_run(self) -> dict[str, dict]:
        """The explore strategy's settings that differ from how `spotlight run --preset` explores (each: this bench's
        value, the run's, and the flag that would set it here): the bench explores with its own flags' defaults, so
        a bench of a preset that explores otherwise measures another design unless told. Empty without `explore`."""
        from workers.explore.state import explore_config_for

        if "explore" not in self.strategies:
            return {}
        mine, run = self.explore_config(), explore_config_for(self.preset)
        pairs = {
            "seed_multipliers": ("--seed-multiplier", mine.seed_multipliers, run.seed_multipliers),
            "cache_levels": ("--level", mine.cache_levels, run.cache_levels),
            "keep_factors": ("--keep-factor", mine.keep_factors, run.keep_factors),
            "control_prompts": ("--control-prompts", mine.control_prompts, run.control_prompts),
            "min_arm_tau": ("--min-arm-tau", mine.bandit.min_arm_tau, run.bandit.min_arm_tau),
        }
        if run.budget_samples is not None:  # a run on a request budget (a GPU preset's stops when training ends)
            pairs["explore_samples"] = ("--explore-samples", self.explore_samples, run.budget_samples)
        return {name: {"bench": b, "run": r, "flag": f} for name, (f, b, r) in pairs.items() if b != r}

    def learning_runs(self, checkpoint: str | None) -> list[LearningRun]:
        config, explore = self.train_config(), self.explore_config()
        runs = [
            LearningRun(s, seed, config, explore, self.explore_samples, checkpoint, self.wider_draw)
            for seed in self.seeds
            for s in STRATEGIES
            if s in self.strategies
        ]
        if not self.shared_base_reading:
            return runs
        # One run reads the base (the first seed's first strategy: the same record whatever the seed list).
        return [
            dataclasses.replace(r, reads_base=r.seed == runs[0].seed and r.strategy == runs[0].strategy) for r in runs
        ]


def run_exploration_bench(
    bench: ExplorationBench,
    checkpoint: Path | None = None,
    out: Path | None = None,
    progress: Callable[[dict], None] | None = None,
    verbose: bool = False,
) -> dict:
    """Every part; returns plain JSON figures (names in docs/EXPLORATION.md). Learning records go to `out`."""
    from workers.bench.exploration_static import static_selection
    from workers.model.tiny_policy import SHIPPED_BASE, load_policy

    torch.set_num_threads(1)
    say = progress or (lambda record: None)
    config = bench.train_config()
    static = (
        static_selection(
            load_policy(checkpoint or SHIPPED_BASE),
            config,
            bench.static_iterations,
            bench.seed_multipliers[0] * config.group_size,
            bench.cache_levels,
            progress=lambda text: say({"stage": text}),
        )
        if bench.static_iterations
        else {"levels": {}}
    )
    specs = bench.learning_runs(None if checkpoint is None else str(checkpoint))
    records = with_base_reading(run_learning(specs, bench.jobs, out, say, verbose))
    timing = run_timing(bench, checkpoint, say) if bench.timing_iterations else []
    base_score = records[0]["curve"][0]["score"]  # every run validates the same weights version 0 first
    learning = summarize_learning(records, base_score, (bench.target_gain, *bench.other_target_gains), bench.resamples)
    ledger_seconds = timing_from_learning(records)
    seconds = summarize_timing(timing) if timing else ledger_seconds  # without pipeline runs: the runs' own ledgers
    return {
        "preset": bench.preset,
        "num_seeds": len(bench.seeds),
        "seeds": list(bench.seeds),
        "iterations": config.iterations,
        "validate_every": bench.validate_every,
        "base_score": base_score,
        "target_gain": bench.target_gain,
        "target_score": round(base_score + bench.target_gain, 6),
        "explore_samples": bench.explore_samples,
        "wider_draw": bench.wider_draw,
        **time_to_target(learning, seconds, bench.target_gain),
        "learning": learning,
        "timing": seconds,
        "learning_timing": ledger_seconds,
        "per_seed_to_target": per_seed_to_target(learning, seconds),
        "static": static,
        "arms": [a.name for a in bench.explore_config().arms(config.group_size)],
        "explore_differs_from_run": bench.differs_from_run(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "learning_runs": records,
        "timing_runs": timing,
    }


def run_learning(
    specs: list[LearningRun], jobs: int, out: Path | None, say: Callable[[dict], None], verbose: bool = False
) -> list[dict]:
    """Every learning run, `jobs` at a time in their own processes (records reused from `out`), in spec order."""
    if jobs == 1:
        records = []
        for spec in specs:
            records.append(learning_run(spec, out, verbose))
            say({"learning_run": _line(records[-1])})
        return records
    done: dict[str, dict] = {}
    context = multiprocessing.get_context("spawn")  # a fresh interpreter per run: no torch state shared
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context) as pool:
        futures = {pool.submit(learning_run, spec, out, verbose): spec.name for spec in specs}
        for future in as_completed(futures):
            done[futures[future]] = future.result()
            say({"learning_run": _line(done[futures[future]])})
    return [done[spec.name] for spec in specs]


def run_timing(bench: ExplorationBench, checkpoint: Path | None, say: Callable[[dict], None]) -> list[dict]:
    """Each strategy's short pipeline run on the first seed: critical-path seconds per iteration and phase."""
    from workers.bench.exploration_run import run_strategy
    from workers.model.tiny_policy import SHIPPED_BASE

    config = dataclasses.replace(bench.train_config(), iterations=bench.timing_iterations)
    return [
        run_strategy(
            s,
            bench.seeds[0],
            config,
            bench.explore_config(),
            checkpoint=checkpoint or SHIPPED_BASE,
            num_workers=bench.num_workers,
            validate_every=bench.timing_iterations + 1,
            wider_draw=bench.wider_draw,
            audit_prompts=bench.audit_prompts,
            progress=say,
        )
        for s in STRATEGIES
        if s in bench.strategies
    ]


def _line(record: dict) -> str:
    curve = record["curve"]
    first, last = curve[0], curve[-1]
    start = "" if first["version"] == 0 else f" (version {first['version']}; the base is read by another run)"
    return (
        f"{record['strategy']:>10} seed {record['seed']}: held-out {first['score']:.3f}{start} -> {last['score']:.3f} "
        f"in {last['version']} iterations ({record['wall_s'] / 60:.1f} min)"
    )


def progress_to_stderr(record: dict) -> None:
    """The CLI's progress printer."""
    text = record.get("stage") or record.get("learning_run")
    if text is None and "critical_s" in record:
        text = f"timing {record['strategy']:>10} it {record['iteration']:>2}  critical {record['critical_s']:7.1f}s"
    if text:
        print(text, file=sys.stderr, flush=True)
