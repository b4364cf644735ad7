"""The `spotlight run` command (registered in pipelines/cli.py); its run settings' options come from
resources/settings/. Only typer and stdlib modules at import time: `--help` stays instant."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import typer

from pipelines.config_cli import config_option
from pipelines.run import RESUME_MAY_CHANGE
from pipelines.run_stop import StopSignals
from pipelines.settings_cli import COMMAND_KEYS, settings_options


@settings_options(COMMAND_KEYS["run"])
def run_command(
    resume: bool = typer.Option(
        False,
        "--resume",
        help="Continue the run in --run-dir from its first unfinished iteration, with its config.yaml; only "
        + ", ".join(k for k in RESUME_MAY_CHANGE if not k.startswith("workers."))
        + " and the workers section may be given anew.",
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
    config_files: Optional[list[Path]] = config_option(),
    **settings,
) -> None:
    """Post-train with the Dagster pipeline's assets in this process (with --nproc N: on rank 0 of N trainer
    processes): sync -> rollout -> train (+ explore) -> validate, per iteration."""
    config = _resolve_config(settings, config_files, resume, overwrite, max_usd)
    _check_reachable(config)
    run_dir = Path(config.deployment.run_dir)
    if overwrite and run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    from pipelines.ranks_cli import in_ranks

    # Ctrl-C and SIGTERM stop the walk alike, also where Dagster's execution holds the signal handlers
    # (pipelines/run_stop.py). --nproc N: the launcher turns a signal into SignalException and stops every rank
    # (pipelines/ranks_cli.py).
    train = config.train
    stop = StopSignals() if train.nproc == 1 else None
    with stop or contextlib.nullcontext():
        code = in_ranks(
            train.nproc,
            train.gradient_checkpointing,
            train.device,
            _walk,
            {"config": config, "max_usd": max_usd, "stop": stop},
            failed_hint=_resume_hint(config),
        )
    if code:
        raise typer.Exit(code)


def _walk(config, max_usd: Optional[float], stop: Optional[StopSignals] = None) -> int:
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
            config,
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
        console.print(_resume_hint(config) + " (with --on-hacking warn or rollback to train on past the flag)")
        return 3
    except (IterationFailedError, KeyboardInterrupt) as err:
        console.print(f"spotlight run stopped: {str(err) or 'interrupted'}")
        console.print(_resume_hint(config))
        return 1
    _print_summary(console, result, time.perf_counter() - started)
    return 0


def _resume_hint(config) -> str:
    return f"continue it with: spotlight run --run-dir {config.deployment.run_dir} --resume"


def _resolve_config(settings: dict, config_files, resume: bool, overwrite: bool, max_usd: Optional[float]):
    """The run's resolved config with every name, path and combination checked, and the run's resources built once
    to check them, before any compute (and before --overwrite deletes)."""
    from pipelines.deploy import DeploymentError, build_resources
    from pipelines.run import resolve_run
    from resources.settings.resolve import ConfigError

    run_dir = settings.pop("run_dir", None)
    try:
        if max_usd is not None and not max_usd > 0:
            raise ConfigError(f"--max-usd must be a positive number of dollars, got {max_usd:g}")
        if overwrite and resume:
            raise ConfigError("--overwrite starts afresh and --resume continues: pass one of them")
        config = resolve_run(
            run_dir, resume=resume, flags=settings, config_files=config_files, replace=overwrite
        ).config
        if overwrite:
            _check_overwrite(
                Path(config.deployment.run_dir), store=config.deployment.store, queue=config.deployment.queue
            )
        train = build_resources(config)["run_config"].train
    except (ConfigError, DeploymentError) as err:
        raise typer.BadParameter(str(err)) from None
    from pipelines.ranks_cli import check_memory, check_ranks

    check_ranks(config.train.nproc, config.train.device, train)
    check_memory(config)  # a run that cannot fit its GPU stops here, before any weights load
    return config


def _check_reachable(config) -> None:
    """A remote queue or store that cannot be reached stops the run here, in one line naming its address,
    before any compute and before anything is written (a worker would otherwise find it, minutes later)."""
    from resources.queue import check_queue_reachable
    from resources.queue.base import QueueError
    from resources.store import check_store_reachable
    from resources.store.base import StoreError

    try:
        d = config.deployment
        if d.queue is not None:
            check_queue_reachable(d.queue)
        if d.store is not None:
            check_store_reachable(d.store)
    except (QueueError, StoreError) as err:
        typer.echo(f"spotlight run: {' '.join(str(err).split())}", err=True)
        raise typer.Exit(2) from None


def _check_overwrite(run_dir: Path, *, store: Optional[str], queue: Optional[str]) -> None:
    """--overwrite deletes a previous run's folder: only when everything that run wrote lives inside it."""
    from pipelines.run import holds_run
    from resources.settings.resolve import ConfigError

    if store is not None or queue is not None:
        raise ConfigError(
            "--overwrite only clears a run whose store and queue live in --run-dir; with --store or "
            "--queue, choose a new --run-dir instead (the run name is the folder's name)"
        )
    if run_dir.is_dir() and any(run_dir.iterdir()) and not holds_run(run_dir):
        raise ConfigError(f"--overwrite refuses to delete {run_dir}: it holds no spotlight run (no config.yaml)")


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
