"""The `spotlight train` command (registered in pipelines/cli.py): the coordinator's iteration driver in this
process, with in-process sampling; its run settings' options come from resources/settings/. Only typer and
stdlib modules at import time: `--help` stays instant."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import typer

from pipelines.config_cli import config_option, resolve_command
from pipelines.ranks_cli import check_memory, check_ranks, in_ranks
from pipelines.settings_cli import COMMAND_KEYS, settings_options

TRAIN_PRESET = "cpu_tiny_long"
"""`spotlight train`'s preset when none is named: the recipe (docs/RECIPE.md)."""
TRAIN_FIXES = ("spotlight train", {"deployment.rollouts": "inprocess"})
"""What `spotlight train` is, whatever a file or variable says: the trainer samples in this process."""
RUN_FILES = ("metrics.jsonl", "ledger.duckdb", "store", "report", "policy", "config.yaml")
"""What `--out` holds after a run (`--overwrite` removes them first)."""


@settings_options(COMMAND_KEYS["train"])
def train_command(
    out: Optional[Path] = typer.Option(
        None, help="Run folder: config.yaml, metrics.jsonl, ledger.duckdb, store/, report/ and the final policy/."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the results already in --out."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per iteration (JSON Lines)."),
    config_files: Optional[list[Path]] = config_option(),
    **settings,
) -> None:
    """Synchronous GRPO post-training in this process: MiniGenEval, or --model DIR on --prompts FILE with --reward."""
    config = resolve_command(settings, config_files, default_preset=TRAIN_PRESET, command=TRAIN_FIXES).config
    from workers.coordinator.run_settings import RunSettings

    try:
        run = RunSettings.of(config)
    except ValueError as err:  # UnsupportedModelError is one
        raise typer.BadParameter(str(err)) from None
    _check_run_options(run, out, overwrite)
    _train_in_ranks(out, run, as_json)


def _train_in_ranks(out: Optional[Path], run, as_json: bool) -> None:
    """`_train` in this process (rank 0 of train.nproc), into `out` or a temporary folder removed afterwards; the
    command exits with its code."""
    train = run.config.train
    run_dir = out.resolve() if out is not None else Path(tempfile.mkdtemp(prefix="spotlight-train-"))
    try:
        code = in_ranks(
            train.nproc,
            train.gradient_checkpointing,
            train.device,
            _train,
            {"run_dir": run_dir, "keep": out is not None, "as_json": as_json, "run": run},
        )
    finally:
        if out is None:
            shutil.rmtree(run_dir, ignore_errors=True)
    if code:
        raise typer.Exit(code)


def _check_run_options(run, out: Optional[Path], overwrite: bool) -> None:
    """BadParameter for a rank count the batch cannot split over, a checkpoint that holds no policy, or an --out
    that holds a run; with --overwrite that run is removed, last, once everything else has passed."""
    config = run.config
    check_ranks(config.train.nproc, config.train.device, run.train)
    check_memory(config)  # a run that cannot fit its GPU stops here, before any weights load
    checkpoint = config.model.checkpoint
    if checkpoint is not None and not (Path(checkpoint) / "policy.json").is_file():
        raise typer.BadParameter(
            f"--checkpoint {checkpoint} holds no policy (no policy.json); pass a folder written "
            "by `spotlight pretrain` or `spotlight train --out`"
        )
    if out is not None and any((out / name).exists() for name in RUN_FILES):
        if not overwrite:
            raise typer.BadParameter(f"{out} already holds a run; choose another folder or pass --overwrite")
        for name in RUN_FILES:
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def _train(run_dir: Path, keep: bool, as_json: bool, run) -> int:
    """The run; returns the exit code (3: stopped by the reward-hacking guard, --on-hacking stop)."""
    from rich.console import Console

    from workers.coordinator import books

    run_dir.mkdir(parents=True, exist_ok=True)
    ctx = _run_context(run_dir, keep, run)
    console = Console(stderr=True)
    succeeded, stopped = False, None
    try:
        stopped = _drive(ctx, run_dir, console, as_json)
        succeeded = stopped is None
    finally:
        if not succeeded:
            books.interrupt_run(ctx.ledger, ctx.run)
        ctx.ledger.close()
    if stopped is not None:
        console.print(
            f"stopped: the reward-hacking guard flagged iteration {stopped['iteration']} "
            f"({stopped['hacking_rule']}); the run is marked interrupted, its signals are in "
            f"SELECT * FROM reward_hacking (--db {run_dir / 'ledger.duckdb'})"
        )
        return 3
    if keep:
        _save_final_policy(ctx, run_dir)
        console.print(
            f"saved the trained policy to {run_dir / 'policy'}; report {run_dir / 'report' / 'index.html'}; "
            f'query the run with spotlight ledger "SELECT * FROM validation_curve" --db {run_dir / "ledger.duckdb"}'
        )
    return 0


def _run_context(run_dir: Path, keep: bool, run):
    """The coordinator's RunContext of this run: local store and ledger in `run_dir` with its config.yaml (when
    kept), in-process sampling (exploring on explore.explore_samples per iteration when given)."""
    import dataclasses

    from resources.settings.resolve import save_config
    from workers.coordinator.context import RunContext, Sampling, run_name_for

    config = run.config
    config = config.model_copy(update={"deployment": config.deployment.model_copy(update={"run_dir": str(run_dir)})})
    ctx = RunContext.local(
        run_dir,
        run_name_for(run_dir) if keep else "train",
        config.preset,
        run.train,
        checkpoint=run.checkpoint,
        reserved_usd_per_hour=config.deployment.reserved_usd_per_hour,
        report=keep,
        model=run.model_fields,
        device=config.train.device,
        validation=run.validation,
        hacking=run.hacking,
    )
    return dataclasses.replace(
        ctx,
        sampling=Sampling.of(config, "inprocess"),
        explore_config=run.explore,
        config=config,
        config_path=save_config(config) if keep else None,
    )


def _drive(ctx, run_dir: Path, console, as_json: bool) -> Optional[dict]:
    """Every iteration of the driver, each record a line (JSON with --json) and a line of metrics.jsonl; returns the
    record that asked the run to stop (the reward-hacking guard), else None."""
    from rich.progress import Progress

    from workers.coordinator.driver import train_records

    stopped = None
    with Progress(console=console, transient=True) as progress, (run_dir / "metrics.jsonl").open("w") as metrics:
        task = progress.add_task("GRPO", total=ctx.train.iterations + 1)
        for record in train_records(ctx):
            line = json.dumps(record, sort_keys=True)
            if as_json:
                typer.echo(line)
            else:
                progress.console.print(_human_line(record))
            metrics.write(line + "\n")
            metrics.flush()
            progress.update(task, completed=record["iteration"] + 1)
            if record.get("hacking_action") == "stop":
                stopped = record
    return stopped


def _save_final_policy(ctx, run_dir: Path) -> None:
    from workers.model.tiny_policy import save_policy
    from workers.trainer.ema_weights import ema_swapped, saved_ema
    from workers.trainer.resident import resident_checkpoint

    policy, _ = resident_checkpoint(ctx.store, ctx.run, ctx.num_iterations)
    save = save_policy
    if ctx.model is not None:
        from workers.model.families.diffusers_policy import save_model_policy

        save = save_model_policy
    save(policy, run_dir / "policy")
    ema = saved_ema(ctx.store, ctx.run, ctx.num_iterations) if ctx.train.ema is not None else None
    if ema is not None:  # train.ema: the EMA of the weights too, what validation scored
        with ema_swapped(policy, ema):
            save(policy, run_dir / "policy_ema")


def _human_line(r: dict) -> str:
    val = "" if r.get("validation_score") is None else f"  held-out {r['validation_score']:.3f}"
    if r.get("hacking_flagged"):
        val += f"  REWARD HACKING? {r['hacking_rule']} ({r['hacking_action']})"
    if "reward_mean" not in r:
        return f"it {r['iteration']:>3}  (final weights){val}"
    return (
        f"it {r['iteration']:>3}  reward {r['reward_mean']:.3f} ± {r['reward_std']:.3f}  "
        f"zero-std {r['zero_std_ratio']:.2f}  step {r['step_s']:.1f}s{val}"
    )
