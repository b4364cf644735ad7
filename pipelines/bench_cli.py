"""`spotlight bench ...`: benchmarks that print figures (registered in pipelines/cli.py). Only typer at import time:
each command imports its benchmark (torch, diffusers) after argument parsing, so `--help` stays instant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

bench_app = typer.Typer(help="Benchmarks that print figures (use --json for machine-readable output).")


def emit_json(record: dict) -> None:
    """One JSON object per line on stdout (JSON Lines), as every command's --json prints."""
    typer.echo(json.dumps(record, sort_keys=True))


def show(figures: dict, as_json: bool, as_text) -> None:
    """A bench's figures: one JSON object, or its text report."""
    if as_json:
        emit_json(figures)
    else:
        typer.echo(as_text(figures))


@bench_app.command("rollout")
def bench_rollout(
    batch_size: int = typer.Option(64, help="Requests sampled together."),
    num_steps: int = typer.Option(8, help="Denoising steps."),
    repeats: int = typer.Option(3, help="Timed repetitions (after one warm-up)."),
    full_sde: bool = typer.Option(False, "--full-sde", help="Flow-GRPO instead: SDE rollouts, every step trained."),
    model: Optional[Path] = typer.Option(None, help="A diffusers pipeline folder instead of the shipped base."),
    lora_rank: Optional[int] = typer.Option(None, help="With --model: LoRA rank (0 = full fine-tuning)."),
    resolution: Optional[int] = typer.Option(None, help="With --model: image side in pixels."),
    reward: Optional[str] = typer.Option(None, help="Reward name (default: the preset's)."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Rollout throughput (samples/s), GRPO update time and the share of rollout time outside the transformer's
    forward, on this machine (cpu_tiny settings: ODE rollouts, NFT)."""
    from workers.bench.rollout import bench_rollout as run

    fields = {k: v for k, v in {"lora_rank": lora_rank, "resolution": resolution}.items() if v is not None}
    try:
        result = run(
            batch_size=batch_size,
            num_steps=num_steps,
            repeats=repeats,
            full_sde=full_sde,
            model=None if model is None else str(model),
            model_fields=fields,
            reward=reward,
            device=device,
        )
    except ValueError as err:  # UnsupportedModelError too
        raise typer.BadParameter(str(err)) from None
    show(result, as_json, lambda r: "\n".join(f"{k:>28}: {v}" for k, v in r.items()))


@bench_app.command("model-check")
def bench_model_check(
    device: str = typer.Option("cuda", help="cuda (the GPU check) or cpu (with --widths tiny)."),
    widths: str = typer.Option("real", help="real: Qwen-Image's transformer widths, 1 and 2 blocks; tiny: toy size."),
    resolution: int = typer.Option(512, help="Image side in pixels."),
    batch_size: int = typer.Option(8, help="Samples per rollout batch (a multiple of 8)."),
    num_steps: int = typer.Option(10, help="Denoising steps."),
    lora_rank: int = typer.Option(64, help="LoRA rank of the LoRA iteration."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The prepared GPU check: a Qwen-Image-shaped model, one LoRA and one full fine-tuning iteration; samples/s,
    update seconds, peak memory (and per block), PULSE GB/s (docs/MODELS.md)."""
    from workers.bench.model_check import run_model_check

    try:
        figures = run_model_check(device, widths, resolution, batch_size, num_steps, lora_rank)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    show(figures, as_json, lambda f: json.dumps(f, indent=2))


@bench_app.command("recipe")
def bench_recipe(
    preset: str = typer.Option("cpu_tiny_long", help="Training preset (workers/trainer/presets.py)."),
    seed: list[int] = typer.Option([0, 1, 2], "--seed", help="Run seeds (repeat the option); one run each."),
    iterations: Optional[int] = typer.Option(None, help="Iterations per run (default: the preset's)."),
    checkpoint: Optional[Path] = typer.Option(None, help="Policy folder to start from (default: the shipped base)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Held-out score before/after `spotlight train` from the shipped base, over several run seeds."""
    from workers.bench.recipe import bench_recipe as run
    from workers.model.policy import SHIPPED_BASE

    def progress(record: dict) -> None:
        if record["validation_score"] is not None:
            typer.echo(
                f"seed {record['seed']}  it {record['iteration']:>3}  {record['wall_s']:>6.0f}s  "
                f"held-out {record['validation_score']:.3f}",
                err=True,
            )

    try:
        figures = run(preset, seed, iterations, checkpoint or SHIPPED_BASE, progress=progress)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if as_json:
        emit_json(figures)
    else:
        for k, v in figures.items():
            if k != "runs":
                typer.echo(f"{k:>20}: {v}")


@bench_app.command("store")
def bench_store(
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per measurement."),
    s3: bool = typer.Option(
        True, "--s3/--no-s3", help="Also measure S3 against an in-process moto server (needs moto[server])."
    ),
    url: Optional[str] = typer.Option(
        None, "--url", help="Also measure this store URL (e.g. s3://bucket/prefix; endpoint from AWS_ENDPOINT_URL)."
    ),
    large_mib: int = typer.Option(64, "--large-mib", help="Size of a large object in MiB."),
    num_small: int = typer.Option(200, "--num-small", help="Small (64 KiB) objects per measurement."),
) -> None:
    """Tensor-store put/get throughput: raw objects and publish/load with checksums."""
    from workers.bench.store_bench import StoreBenchConfig, run_store_benchmarks

    config = StoreBenchConfig(num_small=num_small, large_bytes=large_mib * 1024 * 1024)
    try:
        rows = run_store_benchmarks(config, with_moto=s3, extra_url=url)
    except ValueError as err:
        typer.echo(f"spotlight bench store: {err}", err=True)
        raise typer.Exit(1) from err
    if as_json:
        for row in rows:
            emit_json(row)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("backend", "objects", "op", "mode", "count", "MB/s", "objects/s")
    for r in rows:
        size = r["object_bytes"] / 1024
        size_text = f"{size / 1024:g} MiB" if size >= 1024 else f"{size:g} KiB"
        table.add_row(
            r["backend"],
            f"{r['objects']} {size_text}",
            r["op"],
            r["mode"],
            str(r["count"]),
            f"{r['MB_per_s']:.1f}",
            f"{r['objects_per_s']:.1f}",
        )
    Console().print(table)


@bench_app.command("elastic")
def bench_elastic(
    as_json: bool = typer.Option(False, "--json", help="Print all figures as one JSON object."),
    repeats: int = typer.Option(3, help="Repetitions of each re-form event (medians reported)."),
) -> None:
    """Elastic SP: re-form time after a lost / joining worker, naive vs node agent; SP degree 1 vs 2 throughput."""
    from workers.bench.elastic import run_elastic_bench

    try:
        figures = run_elastic_bench(repeats=repeats)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    if as_json:
        emit_json(figures)
        return
    for path in ("elastic", "naive"):
        for event in ("lost", "join"):
            f = figures[path][event]
            typer.echo(
                f"{path:>8} {event:<5} total {f['total_s']:.3f} s = start {f['process_start_s']:.3f} "
                f"+ rendezvous {f['rendezvous_s']:.3f} + weights {f['weight_transfer_s']:.3f} + warm-up {f['warmup_s']:.3f}"
            )
    typer.echo(f"speedup {figures['speedup']}; throughput {figures['throughput']}")
    typer.echo(f"{figures['projection_20b_8gpu_nvlink']}")


@bench_app.command("pulse")
def bench_pulse(
    as_json: bool = typer.Option(False, "--json", help="Print all figures as one JSON object."),
    quick: bool = typer.Option(False, "--quick", help="A 0.5M-parameter model and 33 states: a smoke run in seconds."),
    dit: bool = typer.Option(True, "--dit/--no-dit", help="Also measure the tiny DiT's own GRPO updates."),
) -> None:
    """PULSESync: BF16 change rate, bytes per changed value and single-core speed on an LM-shaped AdamW trajectory."""
    import logging

    from workers.bench.pulse import run_pulse_bench
    from workers.bench.pulse_report import format_pulse_report

    logging.basicConfig(level=logging.INFO, format="%(message)s")  # progress on stderr
    figures = run_pulse_bench(quick=quick, dit=dit)
    show(figures, as_json, format_pulse_report)


@bench_app.command("pulse-modes")
def bench_pulse_modes(
    model: Optional[Path] = typer.Option(
        None,
        help="A diffusers pipeline folder (default: Qwen-Image at the real widths with --layers blocks, random init).",
    ),
    lora_rank: int = typer.Option(32, help="LoRA rank."),
    steps: int = typer.Option(3, help="Trainer updates, each synced three ways."),
    layers: int = typer.Option(1, help="Without --model: transformer blocks of the real-widths Qwen-Image."),
    resolution: int = typer.Option(64, help="Image side in pixels of the training rollouts."),
    lr: float = typer.Option(3e-4, help="Learning rate (Flow-GRPO's LoRA lr)."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """PULSE on LoRA three ways: adapter patches, merged-weight patches and dense; bytes, changed share,
    encode/apply seconds and the receiver's hash per step."""
    from workers.bench.pulse_modes import report_text, run_pulse_modes

    try:
        figures = run_pulse_modes(None if model is None else str(model), lora_rank, steps, layers, resolution, lr)
    except ValueError as err:  # UnsupportedModelError too
        raise typer.BadParameter(str(err)) from None
    show(figures, as_json, report_text)


@bench_app.command("loco")
def bench_loco(
    as_json: bool = typer.Option(False, "--json", help="Print all figures as one JSON object."),
    quick: bool = typer.Option(False, "--quick", help="Tiny models, 1-2 rounds: a smoke run in under a minute."),
    dit: bool = typer.Option(True, "--dit/--no-dit", help="Run (a), the tiny DiT's GRPO task."),
    lm: bool = typer.Option(True, "--lm/--no-lm", help="Run (b), the LM-shaped synthetic task."),
) -> None:
    """PULSELoCo vs DiLoCo vs DDP: bytes per replica, payload sparsity and training curves (2 replica processes)."""
    from workers.bench.loco import format_loco_report, run_loco_bench

    figures = run_loco_bench(quick=quick, dit=dit, lm=lm)
    show(figures, as_json, format_loco_report)


@bench_app.command("preemption")
def bench_preemption(
    as_json: bool = typer.Option(False, "--json", help="Print all figures as one JSON object."),
    quick: bool = typer.Option(False, "--quick", help="A tiny random policy and fewer trials: a smoke run."),
    with_throughput: bool = typer.Option(
        True, "--throughput/--no-throughput", help="Also time pull vs static assignment with worker processes."
    ),
) -> None:
    """Lost denoising work per preemption with and without state commitment, commit overhead, pull vs static throughput."""
    from workers.bench.preemption import format_preemption_report, run_preemption_bench

    figures = run_preemption_bench(quick=quick, with_throughput=with_throughput)
    show(figures, as_json, format_preemption_report)


@bench_app.command("selection")
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
        from workers.model.policy import load_policy

        policy = load_policy(checkpoint)
    figures = run_selection_bench(bench, policy, progress=lambda line: print(line, file=sys.stderr, flush=True))
    show(figures, as_json, selection_text)


@bench_app.command("exploration")
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
        None, "--strategy", help="Only these strategies (repeat: random, explore, wider_draw)."
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
    out: Optional[Path] = typer.Option(
        None, help="Folder for the learning runs' records; a rerun reuses the ones it holds."
    ),
    checkpoint: Optional[Path] = typer.Option(None, help="Policy folder to start from (default: the shipped base)."),
) -> None:
    """Seed exploration on stale weights vs random seeds vs the wider draw: iterations and critical-path seconds to a
    held-out target over run seeds, with bootstrap intervals; exploration's overhead and rank consistency."""
    import dataclasses

    from workers.bench.exploration import ExplorationBench, progress_to_stderr, run_exploration_bench
    from workers.bench.exploration_summary import format_exploration_report

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
    figures = run_exploration_bench(
        bench,
        None if checkpoint is None else checkpoint.resolve(),
        None if out is None else out.resolve(),
        progress=progress_to_stderr,
        verbose=True,
    )
    show(figures, as_json, format_exploration_report)


@bench_app.command("chaos")
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


@bench_app.command("coordinator")
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
    """Coordinator scale: queue claims/s at 10^5 requests (SQLite, Redis), ledger rows/s, share of a 64-worker iteration."""
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


@bench_app.command("memory")
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
    as_json: bool = typer.Option(False, "--json", help="Print all figures as one JSON object."),
) -> None:
    """Peak RSS of one training iteration (sample, decode, score, update) per samples per iteration, each in a fresh
    process, on the CPU: with chunks everywhere the largest iteration should need about what the smallest needs."""
    import tempfile

    from workers.bench.memory import MemoryBench, format_memory_report, run_memory_bench

    if model is None:
        from workers.model.families.tiny import build_tiny_pipeline

        model = build_tiny_pipeline(
            "qwen-image", Path(tempfile.mkdtemp(prefix="spotlight-memory-")) / "qwen", widths="real", num_layers=layers
        )
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
