"""`spotlight bench` commands that walk training runs: seed selection, exploration, chaos, the coordinator and memory
(registered on `bench_app` by pipelines/bench_cli.py). Only typer at import time: each command imports its benchmark
after argument parsing, so `--help` stays instant."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pipelines.bench_output import show

run_benches = typer.Typer()
"""Commands merged into `spotlight bench` (typer's add_typer without a name)."""


@run_benches.command("selection")
def bench_selection(
    as_json: bool = typer.Option(False, "--json", help="Print all figures as one JSON object."),
    preset: str = typer.Option(
        "cpu_tiny_spot", help="Training preset (workers/trainer/presets.py), e.g. cpu_tiny_hard."
    ),
    prompts: int = typer.Option(16, help="Prompts sampled at every version."),
    candidates: int = typer.Option(32, help="M: candidate seeds per prompt."),
    pair: Optional[list[int]] = typer.Option(
        None, "--pair", help="k of a pair (v_k, v_k+1) (repeat; default 0, 1, 2)."
    ),
    level: Optional[list[str]] = typer.Option(
        None, "--level", help="Cheap levels on the stale weights (repeat; default fbcache, half_steps, quarter_steps)."
    ),
    keep_factor: float = typer.Option(1.5, help="Pre-filter: W = keep_factor x G seeds kept for the rollout."),
    planner_level: str = typer.Option("half_steps", help="The planner arm's level (M candidates, W kept)."),
    seed: int = typer.Option(0, help="Run seed of the training run."),
    checkpoint: Optional[Path] = typer.Option(None, help="Policy folder to start from (default: the shipped base)."),
) -> None:
    """Reward contrast each seed strategy buys on checkpoint pairs (v_k, v_k+1) of one training run: trained groups'
    variance over concurrent random groups', zero-variance share, rollout cost; Kendall tau of each stale level."""
    import sys

    from workers.bench.selection import SelectionBench, run_selection_bench, selection_text

    changes = {
        k: v
        for k, v in {"pairs_at": tuple(pair) if pair else None, "levels": tuple(level) if level else None}.items()
        if v is not None
    }
    try:
        bench = SelectionBench(
            preset=preset,
            num_prompts=prompts,
            num_candidates=candidates,
            keep_factor=keep_factor,
            planner_level=planner_level,
            seed=seed,
            **changes,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if checkpoint is not None and not (checkpoint / "policy.json").exists():
        raise typer.BadParameter(f"--checkpoint {checkpoint} holds no policy (no policy.json)")
    policy = None
    if checkpoint is not None:
        from workers.model.tiny_policy import load_policy

        policy = load_policy(checkpoint)
    figures = run_selection_bench(bench, policy, progress=lambda line: print(line, file=sys.stderr, flush=True))
    show(figures, as_json, selection_text)


@run_benches.command("dead-share")
def bench_dead_share(
    as_json: bool = typer.Option(False, "--json", help="Print all figures as one JSON object."),
    preset: str = typer.Option("cpu_tiny_lowpass", help="Training preset: its prompts, reward, group size, sampler."),
    iterations: int = typer.Option(4, help="Iterations of the preset's prompt schedule to sample."),
    candidates: int = typer.Option(16, help="M: candidate seeds per prompt (blocks of G are the random groups)."),
    seed: int = typer.Option(0, help="Run seed of the prompt schedule and the candidate seeds."),
    checkpoint: Optional[Path] = typer.Option(None, help="Policy folder (default: the shipped base)."),
) -> None:
    """How often a random group of G seeds is dead (every reward equal) on a preset's task, and how often the G of
    largest variance among M candidates still is: seed selection's headroom."""
    import dataclasses
    import sys

    import torch

    from workers.bench.dead_share import dead_share, dead_share_text
    from workers.model.tiny_policy import SHIPPED_BASE, load_policy
    from workers.trainer.presets import get_preset

    try:
        config = dataclasses.replace(get_preset(preset), seed=seed)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if checkpoint is not None and not (checkpoint / "policy.json").exists():
        raise typer.BadParameter(f"--checkpoint {checkpoint} holds no policy (no policy.json)")
    torch.set_num_threads(1)
    try:
        figures = dead_share(
            load_policy(checkpoint or SHIPPED_BASE),
            config,
            iterations,
            candidates,
            progress=lambda line: print(line, file=sys.stderr, flush=True),
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    show({"preset": preset, "seed": seed, **figures}, as_json, dead_share_text)


@run_benches.command("exploration")
def bench_exploration(
    as_json: bool = typer.Option(False, "--json", help="Print all figures as one JSON object."),
    quick: bool = typer.Option(False, "--quick", help="One seed, two tiny iterations: a smoke run in a minute or two."),
    seed: Optional[list[int]] = typer.Option(None, "--seed", help="Run seeds (repeat the option; default 0-7)."),
    iterations: Optional[int] = typer.Option(
        None, help="Training iterations per learning run (default: the preset's)."
    ),
    validate_every: Optional[int] = typer.Option(
        None, help="Held-out validation every this many iterations (default 5)."
    ),
    target_gain: Optional[float] = typer.Option(
        None, help="Headline target = base held-out score + this (default 0.08)."
    ),
    explore_samples: Optional[float] = typer.Option(
        None, help="Exploration budget per iteration, in full-sampler samples (default 128)."
    ),
    wider_draw: Optional[int] = typer.Option(
        None, help="The wider draw's seeds per prompt, as a multiple of the group size (default 2)."
    ),
    timing_iterations: Optional[int] = typer.Option(
        None, help="Iterations of each strategy's pipeline run timing the critical path (default 3; 0: none)."
    ),
    workers: Optional[int] = typer.Option(
        None, help="Rollout worker processes of the timing runs, one thread each (default 2)."
    ),
    jobs: Optional[int] = typer.Option(
        None, help="Learning runs at once, one process and one thread each (default 1)."
    ),
    strategy: Optional[list[str]] = typer.Option(
        None, "--strategy", help="Only these strategies (repeat: random, explore, wider_draw, random_wide = R_2G)."
    ),
    preset: Optional[str] = typer.Option(
        None, help="Training preset (default cpu_tiny_spot; cpu_tiny_hard: strict reward)."
    ),
    keep_factor: Optional[list[float]] = typer.Option(
        None,
        "--keep-factor",
        help="Explore arms keep W = f x G seeds for the rollout (repeat; default 1.0; 1.5: a pre-filter).",
    ),
    control_prompts: Optional[int] = typer.Option(
        None, help="Explore: prompts per iteration kept on random seeds (default 0)."
    ),
    min_arm_tau: Optional[float] = typer.Option(None, help="Explore: drop an arm whose measured tau is below this."),
    seed_multiplier: Optional[list[int]] = typer.Option(
        None, "--seed-multiplier", help="Explore arms' M as multiples of G (repeat; default 2, 3, 4)."
    ),
    level: Optional[list[str]] = typer.Option(
        None, "--level", help="Explore arms' cache levels (repeat; default fbcache, half_steps, quarter_steps)."
    ),
    other_target: Optional[list[float]] = typer.Option(
        None, "--other-target", help="Further target gains to report (repeat; default 0.04, 0.06, 0.10)."
    ),
    static_iterations: Optional[int] = typer.Option(
        None, help="Iterations of prompts in the static cache-level part (default 1; 0: skip it)."
    ),
    shared_base_reading: bool = typer.Option(
        False, "--shared-base-reading", help="Only the first run reads version 0; the others reuse its reading."
    ),
    out: Optional[Path] = typer.Option(
        None, help="Folder for the learning runs' records; a rerun reuses the ones it holds."
    ),
    checkpoint: Optional[Path] = typer.Option(None, help="Policy folder to start from (default: the shipped base)."),
) -> None:
    """Seed exploration on stale weights vs random seeds vs the wider draw: iterations and critical-path seconds to a
    held-out target over run seeds, with bootstrap intervals; exploration's overhead and rank consistency."""
    import dataclasses
    import sys

    from workers.bench.exploration import ExplorationBench, progress_to_stderr, run_exploration_bench
    from workers.bench.exploration_summary import format_exploration_report, run_difference_note

    changes = {
        k: v
        for k, v in {
            "seeds": tuple(seed) if seed else None,
            "iterations": iterations,
            "validate_every": validate_every,
            "target_gain": target_gain,
            "explore_samples": explore_samples,
            "wider_draw": wider_draw,
            "timing_iterations": timing_iterations,
            "num_workers": workers,
            "jobs": jobs,
            "strategies": tuple(strategy) if strategy else None,
            "preset": preset,
            "keep_factors": tuple(keep_factor) if keep_factor else None,
            "control_prompts": control_prompts,
            "min_arm_tau": min_arm_tau,
            "seed_multipliers": tuple(seed_multiplier) if seed_multiplier else None,
            "cache_levels": tuple(level) if level else None,
            "other_target_gains": tuple(other_target) if other_target else None,
            "static_iterations": static_iterations,
            "shared_base_reading": shared_base_reading or None,
        }.items()
        if v is not None
    }
    try:
        bench = dataclasses.replace(ExplorationBench.quick() if quick else ExplorationBench(), **changes)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if checkpoint is not None and not (checkpoint / "policy.json").exists():
        raise typer.BadParameter(f"--checkpoint {checkpoint} holds no policy (no policy.json)")
    if out is not None and out.exists() and not out.is_dir():
        raise typer.BadParameter(f"--out {out} is a file; give a folder for the run records")
    note = run_difference_note(bench.preset, bench.differs_from_run())
    if note:  # before hours of compute: the bench may be about to measure another design than the preset runs
        print(note, file=sys.stderr, flush=True)
    figures = run_exploration_bench(
        bench,
        None if checkpoint is None else checkpoint.resolve(),
        None if out is None else out.resolve(),
        progress=progress_to_stderr,
        verbose=True,
    )
    show(figures, as_json, format_exploration_report)


@run_benches.command("chaos")
def bench_chaos(
    iterations: int = typer.Option(20, help="Iterations of the soak (one batch of rollout requests each)."),
    workers: int = typer.Option(2, help="Spot worker processes (all preemptible)."),
    preemptions_per_hour: float = typer.Option(
        240.0, "--preemptions-per-hour", help="Poisson preemption rate per worker-hour."
    ),
    requests: int = typer.Option(8, help="Rollout requests per iteration."),
    queue: str = typer.Option("sqlite", help="sqlite, or redis (a redis-server of the bench's own, AOF on)."),
    redis_restart_every_s: float = typer.Option(
        0.0, "--redis-restart-every-s", help="With --queue redis: restart the server this often (0: never)."
    ),
    seed: int = typer.Option(0, help="Seed of the preemption trace."),
    quick: bool = typer.Option(
        False, "--quick", help="Two short iterations at a high rate: a smoke run of about a minute."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print all figures as one JSON object."),
) -> None:
    """Soak under preemption: lost, duplicated and fault-free-hash mismatches over many iterations on local workers."""
    from workers.bench.chaos import ChaosBench, format_chaos_report, run_chaos_bench

    changes = {"queue": queue, "redis_restart_every_s": redis_restart_every_s}
    try:
        bench = (
            ChaosBench.quick(**changes)
            if quick
            else ChaosBench(
                num_iterations=iterations,
                num_workers=workers,
                preemptions_per_hour=preemptions_per_hour,
                requests_per_iteration=requests,
                seed=seed,
                **changes,
            )
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    try:
        figures = run_chaos_bench(bench, progress=lambda line: typer.echo(line, err=True))
    except ValueError as err:  # no redis-server for --queue redis
        raise typer.BadParameter(str(err)) from None
    show(figures, as_json, format_chaos_report)


@run_benches.command("coordinator")
def bench_coordinator(
    requests: int = typer.Option(100_000, help="Requests in the queue while claims are timed."),
    claims: int = typer.Option(5_000, help="Claims (then acks) timed against that queue."),
    ledger_rows: int = typer.Option(20_000, "--ledger-rows", help="Attempt rows recorded inside a phase (batched)."),
    workers: int = typer.Option(64, help="Spot workers of the simulated iteration."),
    step_s: float = typer.Option(2.0, "--step-s", help="Simulated seconds per denoising step of a worker."),
    redis: bool = typer.Option(
        True, "--redis/--no-redis", help="Also measure Redis (starts a redis-server of its own)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print all figures as one JSON object."),
) -> None:
    """Coordinator scale: queue claims/s at 10^5 requests (SQLite, Redis), ledger rows/s, share of a 64-worker
    iteration."""
    from workers.bench.coordinator import CoordinatorBench, format_coordinator_report, run_coordinator_bench

    try:
        bench = CoordinatorBench(
            num_requests=requests,
            num_claims=claims,
            num_ledger_rows=ledger_rows,
            num_workers=workers,
            step_s=step_s,
            redis=redis,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    figures = run_coordinator_bench(bench, progress=lambda line: typer.echo(line, err=True))
    show(figures, as_json, format_coordinator_report)


@run_benches.command("memory")
def bench_memory(
    model: Optional[Path] = typer.Option(
        None,
        help="A diffusers pipeline folder (default: a Qwen-Image of the real "
        "transformer widths with --layers blocks and the real VAE, built now).",
    ),
    layers: int = typer.Option(2, help="Without --model: transformer blocks of the real-widths Qwen-Image (of 60)."),
    samples: list[int] = typer.Option([8, 64], "--samples", help="Samples per iteration to measure (repeatable)."),
    rollout_batch: Optional[int] = typer.Option(
        8, "--rollout-batch", help="Samples sampled and decoded together (0: all at once)."
    ),
    micro_batch: Optional[int] = typer.Option(
        8, "--micro-batch", help="Samples per forward and backward in the update (0: the whole minibatch)."
    ),
    resolution: int = typer.Option(128, help="Image side in pixels."),
    num_steps: int = typer.Option(2, help="Denoising steps (all SDE, all trained)."),
    threads: int = typer.Option(2, help="Torch threads of each measuring process."),
    nproc: int = typer.Option(
        1, help="2 or more: each gloo rank's peak RSS through one iteration of the real phases, against one process."
    ),
    lora_rank: int = typer.Option(64, help="With --nproc: LoRA rank (0: full fine-tuning over FSDP2)."),
    calibrate: bool = typer.Option(
        False, "--calibrate", help="The memory plan's figures: one block's saved activations, sampling and VAE peaks."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print all figures as one JSON object."),
) -> None:
    """Peak RSS of one training iteration (sample, decode, score, update) per samples per iteration, each in a fresh
    process, on the CPU: with chunks everywhere the largest iteration should need about what the smallest needs.
    --nproc N: the same per trainer rank; --calibrate: what the memory plan scales (spotlight config --memory)."""
    import tempfile

    from workers.bench.memory import MemoryBench, format_memory_report, run_memory_bench

    if model is None:
        from workers.model.families.tiny import build_tiny_pipeline

        model = build_tiny_pipeline(
            "qwen-image", Path(tempfile.mkdtemp(prefix="spotlight-memory-")) / "qwen", widths="real", num_layers=layers
        )
    if calibrate or nproc > 1:
        _memory_variant(str(Path(model).resolve()), calibrate, nproc, lora_rank, resolution, threads, as_json)
        return
    try:
        bench = MemoryBench(
            model=str(Path(model).resolve()),
            samples=tuple(samples),
            rollout_batch=rollout_batch or None,
            micro_batch=micro_batch or None,
            resolution=resolution,
            num_steps=num_steps,
            threads=threads,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    figures = run_memory_bench(bench, progress=lambda line: typer.echo(line, err=True))
    figures["model"] = str(model)
    show(figures, as_json, format_memory_report)


def _memory_variant(
    model: str, calibrate: bool, nproc: int, lora_rank: int, resolution: int, threads: int, as_json: bool
) -> None:
    """`bench memory --calibrate` or `--nproc N`."""
    from workers.bench.memory_calibrate import CalibrationBench, format_calibration
    from workers.bench.memory_calibrate import calibrate as run_calibration
    from workers.bench.memory_ranks import RanksBench, format_ranks_report, run_ranks_bench

    try:
        if calibrate:
            bench = CalibrationBench(model=model, resolution=resolution, lora_rank=lora_rank, threads=threads)
            figures, report = run_calibration(bench), format_calibration
        else:
            ranks = RanksBench(model=model, nproc=nproc, lora_rank=lora_rank, resolution=resolution, threads=threads)
            figures = run_ranks_bench(ranks, progress=lambda line: typer.echo(line, err=True))
            report = format_ranks_report
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    figures["model"] = model
    show(figures, as_json, report)
