"""The `spotlight run` command (registered in pipelines/cli.py). Only typer and pipelines.run's stdlib module at
import time: `--help` stays instant."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path
from typing import Optional

import typer

from pipelines.config_file import config_option
from pipelines.prompts_cli import PROMPTS_HELDOUT_HELP, PROMPTS_HELP
from pipelines.ranks_cli import ADVANTAGE_HELP, CHECKPOINTING_HELP, MICRO_BATCH_HELP, NPROC_HELP, ROLLOUT_BATCH_HELP
from pipelines.run import DEFAULT_PREEMPTIONS_PER_HOUR, DEFAULT_WORKERS


def run_command(
    iterations: Optional[int] = typer.Option(None, help="Training iterations (default: the preset's)."),
    preset: Optional[str] = typer.Option(
        None, help="Training preset (workers/trainer/presets.py; default cpu_tiny_spot)."
    ),
    seed: Optional[int] = typer.Option(
        None, "--seed", help="Run seed: the prompt schedule and every request's seed (default: the preset's, 0)."
    ),
    reward: Optional[str] = typer.Option(
        None,
        help="Reward overriding the preset's: a name (minigeneval, minigeneval_strict, jpeg_compressibility), clip:PATH, multi:a=1,b=0.1, or a reward server's http:// URL (docs/MODELS.md).",
    ),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help=PROMPTS_HELP),
    prompts_heldout: Optional[float] = typer.Option(None, "--prompts-heldout", help=PROMPTS_HELDOUT_HELP),
    store: Optional[str] = typer.Option(
        None,
        help="Tensor store: a folder or s3://bucket/prefix (default: RUN_DIR/store). S3 endpoint and credentials come from boto3's configuration (AWS_ENDPOINT_URL, AWS_PROFILE, ...).",
    ),
    queue: Optional[str] = typer.Option(
        None, help="Request queue: a SQLite file or redis://host:port/db (default: RUN_DIR/queue.db)."
    ),
    run_dir: Path = typer.Option(
        Path("runs/run"),
        "--run-dir",
        help="Run folder: run.json, ledger.duckdb, report/, and the store and queue by default.",
    ),
    resume: bool = typer.Option(
        False, "--resume", help="Continue the run in --run-dir from its first unfinished iteration."
    ),
    rollouts: Optional[str] = typer.Option(
        None,
        help="Who samples: local_cluster (default: rollout worker processes on this machine, spot-priced, with injected preemptions) or inprocess (the trainer itself, batched; no workers).",
    ),
    explore_samples: Optional[float] = typer.Option(
        None,
        "--explore-samples",
        help="--rollouts inprocess: explore the next iteration's seeds on the stale weights within this many full-sampler samples per iteration, in this process (docs/EXPLORATION.md).",
    ),
    workers: Optional[int] = typer.Option(
        None,
        "--workers",
        help=f"local_cluster: rollout worker processes, one torch thread each (default {DEFAULT_WORKERS}; 0 on a Redis --queue: remote workers sample everything).",
    ),
    preemptions_per_hour: Optional[float] = typer.Option(
        None,
        help=f"local_cluster: preemptions per spot worker-hour, Poisson, half without notice (default {DEFAULT_PREEMPTIONS_PER_HOUR:g}; 0 = none).",
    ),
    checkpoint: Optional[str] = typer.Option(None, help="Policy folder to start from (default: the shipped base)."),
    model: Optional[str] = typer.Option(
        None,
        help="A diffusers pipeline folder to post-train (Qwen-Image, SD3/3.5, FLUX.1), loaded locally by the trainer and every worker (docs/MODELS.md).",
    ),
    lora_rank: Optional[int] = typer.Option(None, help="With --model: LoRA rank (0 = full fine-tuning)."),
    resolution: Optional[int] = typer.Option(None, help="With --model: image side in pixels."),
    guidance: Optional[float] = typer.Option(None, help="With --model: true-CFG scale, or FLUX.1-dev's guidance."),
    sync_mode: Optional[str] = typer.Option(
        None,
        "--sync-mode",
        help="With --model and a LoRA: what PULSE ships to the rollout workers, lora (the adapter; default) or merged (BF16 base + LoRA delta of every weight: workers need no adapter).",
    ),
    device: Optional[str] = typer.Option(None, help="The trainer's device: cpu (default), cuda or cuda:N."),
    nproc: Optional[int] = typer.Option(
        None, "--nproc", help=NPROC_HELP + " Default 1; --resume keeps the run's unless given."
    ),
    gradient_checkpointing: Optional[bool] = typer.Option(
        None,
        "--gradient-checkpointing/--no-gradient-checkpointing",
        help=CHECKPOINTING_HELP + " --resume keeps the run's unless given.",
        show_default=False,
    ),
    validation_reward: Optional[str] = typer.Option(
        None,
        "--validation-reward",
        help="Reward that scores the held-out images, averaged over prompts x fixed seeds (default: MiniGenEval's detector for the pixel policy; with --model the run's reward).",
    ),
    validation_prompts: Optional[Path] = typer.Option(
        None,
        "--validation-prompts",
        help="A text file of held-out prompts, one a line, # for comments (default: MiniGenEval's held-out split; the pixel policy reads only MiniGenEval prompts).",
    ),
    on_hacking: Optional[str] = typer.Option(
        None,
        "--on-hacking",
        help="When the reward-hacking guard flags a validation (docs/REWARD_HACKING.md): warn (default: record it, fail the Dagster check), stop (end after that iteration; --resume continues, and may change this flag) or rollback (continue from the best-gold weights at a lower lr / stronger KL).",
    ),
    hacking_window: Optional[int] = typer.Option(
        None,
        "--hacking-window",
        help="Validations back the guard compares the proxy and gold rewards over (default 2).",
    ),
    hacking_z: Optional[float] = typer.Option(
        None, "--hacking-z", help="Standard errors the proxy's rise and the gold's fall must each exceed (default 2)."
    ),
    hacking_max_drop: Optional[float] = typer.Option(
        None,
        "--hacking-max-drop",
        help="Largest relative fall of a held-out image statistic below the base's (default 0.5; 0 = off).",
    ),
    hacking_max_rise: Optional[float] = typer.Option(
        None,
        "--hacking-max-rise",
        help="Largest relative rise of a held-out image statistic above the base's (default: rises never fire).",
    ),
    rollback_lr_scale: Optional[float] = typer.Option(
        None, "--rollback-lr-scale", help="With --on-hacking rollback: learning-rate factor per rollback (default 0.5)."
    ),
    rollback_kl_beta: Optional[float] = typer.Option(
        None,
        "--rollback-kl-beta",
        help="With --on-hacking rollback: train on with at least this KL coefficient (default: the preset's).",
    ),
    overwrite: bool = typer.Option(
        False,
        "--overwrite",
        help="Delete the run already in --run-dir (ledger, report, store, queue) and start afresh.",
    ),
    max_usd: Optional[float] = typer.Option(
        None,
        "--max-usd",
        help="Stop after the iteration during which the ledger's spend (run_cost) reaches this many dollars; on a Redis queue, spot workers that start after that end at once. Not stored: give it again with --resume.",
    ),
    rollout_batch: Optional[int] = typer.Option(
        None, "--rollout-batch", help=ROLLOUT_BATCH_HELP + " --resume keeps the run's unless given."
    ),
    micro_batch: Optional[int] = typer.Option(
        None, "--micro-batch", help=MICRO_BATCH_HELP + " --resume keeps the run's unless given."
    ),
    group_size: Optional[int] = typer.Option(
        None, "--group-size", help="Samples per prompt the update compares (GRPO's group; default: the preset's)."
    ),
    prompts_per_iteration: Optional[int] = typer.Option(
        None, "--prompts-per-iteration", help="Prompts sampled per iteration (default: the preset's)."
    ),
    minibatches: Optional[int] = typer.Option(
        None, "--minibatches", help="Optimizer steps per epoch (default: the preset's)."
    ),
    advantage: Optional[str] = typer.Option(None, "--advantage", help=ADVANTAGE_HELP),
    config_file: Optional[Path] = config_option(),
) -> None:
    """Post-train with the Dagster pipeline's assets in this process (with --nproc N: on rank 0 of N trainer processes): sync -> rollout -> train (+ explore) -> validate, per iteration."""
    asked = _asked(locals())  # first: every parameter, nothing else yet
    spec = _resolve_spec(run_dir, resume, overwrite, max_usd, asked)
    _check_reachable(spec)
    if overwrite and run_dir.exists():
        import shutil

        shutil.rmtree(run_dir)
    from pipelines.ranks_cli import in_ranks

    # --nproc N: the launcher turns a signal into SignalException and stops every rank (pipelines/ranks_cli.py).
    stop_on_sigterm = _sigterm_as_ctrl_c() if spec.nproc == 1 else contextlib.nullcontext()
    with stop_on_sigterm:
        code = in_ranks(
            spec.nproc,
            spec.gradient_checkpointing,
            spec.device,
            _walk,
            {"spec": spec, "max_usd": max_usd},
            failed_hint=_resume_hint(spec),
        )
    if code:
        raise typer.Exit(code)


NOT_RUN_SETTINGS = ("run_dir", "resume", "overwrite", "max_usd", "config_file")
"""run_command's parameters that say what to do with the run folder, not how the run trains (RunSpec's fields)."""


def _asked(options: dict) -> dict:
    """The RunSpec fields run_command was given (None: not given): its parameters, paths as strings, --workers as
    num_workers; a new run of a GPU preset checkpoints gradients unless told not to."""
    asked = {
        ("num_workers" if name == "workers" else name): (str(value) if isinstance(value, Path) else value)
        for name, value in options.items()
        if name not in NOT_RUN_SETTINGS
    }
    if asked["gradient_checkpointing"] is None and not options["resume"]:
        from workers.trainer.presets import checkpointing_by_default

        asked["gradient_checkpointing"] = checkpointing_by_default(asked["preset"] or "cpu_tiny_spot") or None
    return asked


def _walk(spec, max_usd: Optional[float]) -> int:
    """The whole run in this process (rank 0 of --nproc ranks): the walk, its local worker cluster, the lines and the
    summary. Returns the command's exit code."""
    import time

    from rich.console import Console

    from pipelines.run import BudgetReachedError, HackingStoppedError, execute
    from pipelines.run_walk import IterationFailedError

    console = Console(stderr=True)
    started = time.perf_counter()
    try:
        result = execute(spec, console, on_iteration=lambda o: console.print(_line(o)), max_usd=max_usd)
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


@contextlib.contextmanager
def _sigterm_as_ctrl_c():
    """While the run walks: SIGTERM (`kill`, a supervisor, a VM shutting down) stops it as Ctrl-C does, so the ledger
    marks the run interrupted, local workers are stopped and the resume hint is printed (the default action would end
    the process at once, between two of Dagster's own handlers, with none of that)."""

    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
