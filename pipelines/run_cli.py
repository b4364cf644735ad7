"""The `spotlight run` command (registered in pipelines/cli.py); its run settings' options come from
resources/settings/. Only typer and stdlib modules at import time: `--help` stays instant."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import typer

from pipelines.config_file import config_option
from pipelines.run import RESUME_MAY_CHANGE
from pipelines.run_stop import StopSignals
from pipelines.settings_cli import settings_options


@settings_options(
    "run", unset=True, notes={name: "--resume keeps the run's unless given." for name in RESUME_MAY_CHANGE}
)
def run_command(
    run_dir: Path = typer.Option(
        Path("runs/run"),
        "--run-dir",
        help="Run folder: run.json, ledger.duckdb, report/, and the store and queue by default.",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in --run-dir from its first unfinished iteration."
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Delete the run already in --run-dir (ledger, report, store, queue) and start afresh.",
    ),
    max_usd: Optional[float] = typer.Option(
        None,
        "--max-usd",
        help="Stop after the iteration during which the ledger's spend (run_cost) reaches this many dollars; on a "
        "Redis queue, spot workers that start after that end at once. Not stored: give it again with --resume.",
    ),
    config_file: Optional[Path] = config_option(),
    **settings,
) -> None:
    """Post-train with the Dagster pipeline's assets in this process (with --nproc N: on rank 0 of N trainer
    processes): sync -> rollout -> train (+ explore) -> validate, per iteration."""
    asked = _asked(settings, resume)
    spec = _resolve_spec(run_dir, resume, overwrite, max_usd, asked)
    _check_reachable(spec)
    if overwrite and run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    from pipelines.ranks_cli import in_ranks

    # Ctrl-C and SIGTERM stop the walk alike, also where Dagster's execution holds the signal handlers
    # (pipelines/run_stop.py). --nproc N: the launcher turns a signal into SignalException and stops every rank
    # (pipelines/ranks_cli.py).
    stop = StopSignals() if spec.nproc == 1 else None
    with stop or contextlib.nullcontext():
        code = in_ranks(
            spec.nproc,
            spec.gradient_checkpointing,
            spec.device,
            _walk,
            {"spec": spec, "max_usd": max_usd, "stop": stop},
            failed_hint=_resume_hint(spec),
        )
    if code:
        raise typer.Exit(code)


def _asked(settings: dict, resume: bool) -> dict:
    """The RunSpec fields run_command was given (None: not given), paths as strings; a new run of a GPU preset
    checkpoints gradients unless told not to."""
    asked = {name: (str(value) if isinstance(value, Path) else value) for name, value in settings.items()}
    if asked["gradient_checkpointing"] is None and not resume:
        from workers.trainer.presets import checkpointing_by_default

        asked["gradient_checkpointing"] = checkpointing_by_default(asked["preset"] or "cpu_tiny_spot") or None
    return asked


def _walk(spec, max_usd: Optional[float], stop: Optional[StopSignals] = None) -> int:
    """The whole run in this process (rank 0 of --nproc ranks): the walk, its local worker cluster, the lines and the
    summary; `stop`: the stop signals' record the walk checks after each iteration. Returns the command's exit
    code."""
    import time

    from rich.console import Console

    from pipelines.run import BudgetReachedError, HackingStoppedError, execute
    from pipelines.run_walk import IterationFailedError

    console = Console(stderr=True)
    started = time.perf_counter()
    try:
        result = execute(
            spec,
            console,
            on_iteration=lambda o: console.print(_line(o)),
            max_usd=max_usd,
            check_stop=stop.check if stop is not None else lambda: None,
        )
    except BudgetReachedError as err:
        console.print(f"spotlight run stopped: {err}")
        return 0
    except HackingStoppedError as err:
        console.print(f"spotlight run stopped: {err}")
        console.print(_resume_hint(spec) + " (with --on-hacking warn or rollback to train on past the flag)")
        return 3
    except (IterationFailedError, KeyboardInterrupt) as err:
        console.print(f"spotlight run stopped: {str(err) or 'interrupted'}")
        console.print(_resume_hint(spec))
        return 1
    _print_summary(console, result, time.perf_counter() - started)
    return 0


def _resume_hint(spec) -> str:
    return f"continue it with: spotlight run --run-dir {spec.run_dir} --resume"


def _resolve_spec(run_dir: Path, resume: bool, overwrite: bool, max_usd: Optional[float], asked: dict):
    """The run's RunSpec with every name and URL checked, before any compute (and before --overwrite deletes)."""
    from pipelines.run import RunSpec

    try:
        if max_usd is not None and not max_usd > 0:
            raise ValueError(f"--max-usd must be a positive number of dollars, got {max_usd:g}")
        if overwrite:
            _check_overwrite(run_dir, resume=resume, store=asked["store"], queue=asked["queue"])
        spec = RunSpec.resolve(run_dir, resume=resume, replace=overwrite, **asked)
        config = spec.resources()["run_config"].train_config()
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    from pipelines.ranks_cli import check_ranks

    check_ranks(spec.nproc, spec.device, config)
    return spec


def _check_reachable(spec) -> None:
    """A remote queue or store that cannot be reached stops the run here, in one line naming its address,
    before any compute and before anything is written (a worker would otherwise find it, minutes later)."""
    from resources.queue import check_queue_reachable
    from resources.queue.base import QueueError
    from resources.store import check_store_reachable
    from resources.store.base import StoreError

    try:
        if spec.queue is not None:
            check_queue_reachable(spec.queue)
        if spec.store is not None:
            check_store_reachable(spec.store)
    except (QueueError, StoreError) as err:
        typer.echo(f"spotlight run: {' '.join(str(err).split())}", err=True)
        raise typer.Exit(2) from None


def _check_overwrite(run_dir: Path, *, resume: bool, store: Optional[str], queue: Optional[str]) -> None:
    """--overwrite deletes a previous run's folder: only when everything that run wrote lives inside it."""
    from pipelines.run import SPEC_NAME

    if resume:
        raise ValueError("--overwrite starts afresh and --resume continues: pass one of them")
    if store is not None or queue is not None:
        raise ValueError(
            "--overwrite only clears a run whose store and queue live in --run-dir; with --store or "
            "--queue, choose a new --run-dir instead (the run name is the folder's name)"
        )
    holds_run = (run_dir / SPEC_NAME).is_file() or (run_dir / "ledger.duckdb").is_file()
    if run_dir.is_dir() and any(run_dir.iterdir()) and not holds_run:
        raise ValueError(f"--overwrite refuses to delete {run_dir}: it holds no spotlight run (no {SPEC_NAME})")


def _line(outcome) -> str:
    if outcome.skipped:
        return f"it {outcome.iteration:>3}  done earlier (resumed)"
    meta = outcome.metadata
    parts = [f"it {outcome.iteration:>3}"]
    if "rollouts" in meta:
        parts.append(f"reward {meta['rollouts']['reward_mean']:.3f}")
    if meta.get("validation", {}).get("validated", True) and "score" in meta.get("validation", {}):
        parts.append(f"held-out {meta['validation']['score']:.3f}")
    if meta.get("rollouts", {}).get("preemptions"):
        parts.append(f"{meta['rollouts']['preemptions']} preempted")
    parts.append(f"sync {meta['weight_patch']['sent_bytes'] / 1024:.0f} KiB")
    parts.append(f"{outcome.seconds:.1f} s")
    return "  ".join(parts)


def _print_summary(console, result: dict, wall_s: float) -> None:
    from rich.table import Table

    table = Table(
        "it", "reward", "held-out", "$ spot", "$ reserved", "preempt.", "dense B", "PULSE B", title="spotlight run"
    )
    for r in result["rows"]:
        table.add_row(
            str(r["iteration"]),
            _num(r["reward_mean"]),
            _num(r["heldout_score"]),
            _usd(r["usd_spot"]),
            _usd(r["usd_reserved"]),
            str(r["preemptions"]),
            str(r["dense_bytes"] or ""),
            str(r["patch_bytes"] or ""),
        )
    Console = type(console)
    Console().print(table)
    cost = result["cost"]
    console.print(
        f"wall {wall_s / 60:.1f} min; cost ${cost['usd_total']:.4f} (spot ${cost['usd_spot']:.4f}, "
        f"reserved ${cost['usd_reserved']:.4f})"
    )
    console.print(f"report: {result['report']}")
    console.print(f'ledger: spotlight ledger "SELECT * FROM validation_curve" --db {result["ledger"]}')


def _usd(value) -> str:
    return "" if value is None else f"{value:.5f}"


def _num(value) -> str:
    return "" if value is None else f"{value:.4g}"
