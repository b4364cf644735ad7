"""`spotlight bench ...`: benchmarks that print figures (registered in pipelines/cli.py). Only typer at import time:
each command imports its benchmark (torch, diffusers) after argument parsing, so `--help` stays instant."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from pipelines.bench_output import emit_json, show
from pipelines.bench_run_cli import run_benches

bench_app = typer.Typer(help="Benchmarks that print figures (use --json for machine-readable output).")


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
    from workers.model.tiny_policy import SHIPPED_BASE

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
                f"+ rendezvous {f['rendezvous_s']:.3f} + weights {f['weight_transfer_s']:.3f} "
                f"+ warm-up {f['warmup_s']:.3f}"
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


@bench_app.command("receiver")
def bench_receiver(
    versions: int = typer.Option(20, help="Sync versions published, with the receiver kept and replayed."),
    anchor_every: int = typer.Option(10, help="A full anchor every this many versions."),
    layers: int = typer.Option(1, help="Blocks of the real-widths Qwen-Image in the memory runs (0: skip them)."),
    memory_version: int = typer.Option(3, help="The version a fresh worker reaches in the memory runs."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """PULSE receivers: the sync phase's seconds and store bytes per version (receiver kept vs replayed from the
    anchor), and a fresh worker's peak RSS with FP32 vs BF16 resident weights."""
    from workers.bench.receiver import ReceiverBench, format_receiver_report, run_receiver_bench

    try:
        bench = ReceiverBench(
            versions=versions, anchor_every=anchor_every, layers=layers, memory_version=memory_version
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    figures = run_receiver_bench(bench, progress=lambda line: typer.echo(line, err=True))
    show(figures, as_json, format_receiver_report)


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
    """Lost denoising work per preemption with and without state commitment, commit overhead, pull vs static
    throughput."""
    from workers.bench.preemption import format_preemption_report, run_preemption_bench

    figures = run_preemption_bench(quick=quick, with_throughput=with_throughput)
    show(figures, as_json, format_preemption_report)


bench_app.add_typer(run_benches)
