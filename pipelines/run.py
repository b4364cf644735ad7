"""`spotlight run`: a whole post-training run on this machine, walking the pipeline's assets iteration by iteration.

The run folder holds `config.yaml` (the resolved config, so `--resume` continues the same run and every worker
reads the same settings), `ledger.duckdb`, `store/` (default), `queue.db` and `report/`. By default
(`deployment.rollouts local_pool`) one pool of rollout worker processes lives for the whole run, pulling from the
queue, preempted on a Poisson trace; the rollout assets then enqueue and wait. `inprocess` samples in this process
instead (no workers, no preemptions). Paths are stored absolute (relative ones mean relative to the directory
`spotlight run` started in), so worker processes and a later `--resume` from elsewhere find the same files.
With `--nproc N` the command (pipelines/run_cli.py) calls `execute` on rank 0 of N trainer processes
(pipelines/ranks_cli.py): the walk, the local cluster and every write are rank 0's, and Dagster's in-process
execution runs the train asset's step in that process, whose trainer setup orders the other ranks to join.

Example:
    resolved = resolve_run(Path("runs/demo"), resume=False, flags={"preset": "cpu_smoke"}, config_files=[])
    execute(resolved.config, console)
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from resources.settings.config import RunConfig
from resources.settings.fields import LEAVES
from resources.settings.resolve import CONFIG_NAME, ConfigError, Resolved, get_value, load_config, save_config
from workers.task.prompt_file import file_digest

LEGACY_SPEC_NAME = "run.json"
"""What runs stored before config.yaml: its flat settings are read as a config layer over its preset."""
RESUME_MAY_CHANGE = (
    "train.nproc",
    "train.device",
    "train.gradient_checkpointing",
    "train.micro_batch",
    "sampling.rollout_batch",
    "guard.on_hacking",
    "validation.report_every",
    "explore.explore",
    "deployment.run_dir",
    "deployment.reserved_usd_per_hour",
    *(k for k in LEAVES if k.startswith("workers.")),
)
"""Settings a --resume may change: how each update is computed, not what (N ranks train what one process trains, and
chunks and micro-batches compute what the whole batch does, to float rounding), so a relaunch on another number or
size of GPUs continues the run (at that node's price); who samples and how often they are preempted; where the
folder now is; and what a reward-hacking flag does (a run stopped by one continues with --on-hacking warn or
rollback). Unset, they keep the stored values; any other setting given differently is refused by name."""
PROMPTS_DIGEST_NAME = "prompts.digest.json"
"""In the run folder: the --prompts file's path and blake2b digest when the run started."""


def holds_run(run_dir: Path) -> bool:
    return any((run_dir / name).exists() for name in (CONFIG_NAME, LEGACY_SPEC_NAME, "ledger.duckdb"))


def resolve_run(
    run_dir: Optional[Path],
    *,
    resume: bool,
    flags: dict,
    config_files: Sequence[Path] = (),
    replace: bool = False,
    resolve=None,
) -> Resolved:
    """A new run's config, or on --resume the stored one with what is given again (settings outside
    RESUME_MAY_CHANGE must agree with it); --resume on a folder without a run starts one. `replace`: a new run that
    will replace the one in its folder (the caller deletes it). `resolve`: pipelines.config_cli.resolve_settings.
    ConfigError (a ValueError) saying what to change."""
    if resolve is None:
        from pipelines.config_cli import resolve_settings as resolve
    if run_dir is not None:
        flags = {**flags, "run_dir": str(run_dir)}
    resolved = resolve(flags, config_files)
    run_dir = Path(resolved.config.deployment.run_dir)
    if not resume:
        if not replace and holds_run(run_dir):
            raise ConfigError(f"{run_dir} already holds a run; continue it with --resume or choose another --run-dir")
        return resolved
    stored = stored_config(run_dir, resolve)
    if stored is None:
        if (run_dir / "ledger.duckdb").exists():
            raise ConfigError(
                f"{run_dir} holds a ledger but no {CONFIG_NAME}: it was not written by `spotlight run`; "
                "choose another --run-dir"
            )
        # Resume-or-start: a node that runs `spotlight run --resume` on every (re)start begins the run the first time.
        return resolved
    resumed = resolve(flags, config_files, base=stored, base_origin=f"{run_dir / CONFIG_NAME}")
    clashes = [
        f"{key} {get_value(resumed.config, key)!r} ({origin}; the run has {get_value(stored, key)!r})"
        for key, origin in resumed.origins.items()
        if key not in RESUME_MAY_CHANGE
        and not origin.startswith(str(run_dir))
        and get_value(resumed.config, key) != get_value(stored, key)
    ]
    if clashes:
        raise ConfigError(
            "--resume continues the stored run, and these settings cannot change mid-run: "
            + "; ".join(clashes)
            + f". Start a new run (another --run-dir) to change them, or drop them (the run keeps {CONFIG_NAME}'s)"
        )
    check_prompts_unchanged(resumed.config)
    return resumed


def stored_config(run_dir: Path, resolve) -> Optional[RunConfig]:
    """The run's saved config.yaml; a run.json of before, read as a layer of flat settings over its preset; None."""
    if (run_dir / CONFIG_NAME).is_file():
        return load_config(run_dir / CONFIG_NAME)
    legacy = run_dir / LEGACY_SPEC_NAME
    if not legacy.is_file():
        return None
    stored = json.loads(legacy.read_text())
    renamed = {"num_workers": "local_workers"}
    flags = {renamed.get(k, k): v for k, v in stored.items() if v is not None}
    if flags.get("rollouts") == "local_cluster":  # the name local_pool had
        flags["rollouts"] = "local_pool"
    return resolve(flags, (), env={}, check_paths=False).config


def save_run_config(config: RunConfig) -> None:
    """config.yaml in the run folder (0600); the first save of a run with a prompts file also records the file's
    digest (PROMPTS_DIGEST_NAME), for --resume."""
    save_config(config)
    prompts = config.train.prompts
    digest = Path(config.deployment.run_dir) / PROMPTS_DIGEST_NAME
    if prompts is not None and not digest.exists():
        digest.write_text(json.dumps({"path": prompts, "digest": file_digest(Path(prompts))}))


def check_prompts_unchanged(config: RunConfig) -> None:
    """ConfigError when the prompts file differs from the one the run started on: a resumed run would draw its
    prompts from the new file, so what was trained and what is trained next would be two tasks."""
    recorded = Path(config.deployment.run_dir) / PROMPTS_DIGEST_NAME
    prompts = config.train.prompts
    if prompts is None or not recorded.is_file():
        return
    if file_digest(Path(prompts)) != json.loads(recorded.read_text())["digest"]:
        raise ConfigError(
            f"--prompts {prompts} changed since the run started (its digest differs from the one in "
            f"{recorded}); restore the file to continue this run, or start a new run (another --run-dir) "
            "on the new file"
        )


class BudgetReachedError(RuntimeError):
    """The ledger's spend reached --max-usd; the message says how much and how to continue."""


class HackingStoppedError(RuntimeError):
    """The reward-hacking guard flagged a validation and the run stops on a flag (--on-hacking stop)."""


def check_hacking_stop(outcome) -> None:
    """HackingStoppedError, naming the iteration and the rule, when its validation asked the run to stop."""
    validation = outcome.metadata.get("validation", {})
    if validation.get("hacking_action") == "stop":
        raise HackingStoppedError(
            f"the reward-hacking guard flagged iteration {outcome.iteration} "
            f"({validation.get('hacking_rule')}: {validation.get('hacking_detail')}); its "
            'signals: spotlight ledger "SELECT * FROM reward_hacking"'
        )


@contextlib.contextmanager
def run_cluster(config: RunConfig, resources: dict, max_usd: Optional[float] = None) -> Iterator[None]:
    """With deployment.rollouts local_pool: worker processes for the whole run, preempted on a Poisson trace."""
    with remote_workers(resources, max_usd):
        workers = config.workers
        if config.deployment.rollouts != "local_pool" or workers.local_workers == 0:
            yield
            return
        from assets.context import run_context
        from assets.run_config import WORKER_LOGS
        from workers.coordinator.worker_pool import worker_pool

        with worker_pool(
            run_context(**resources),
            workers.local_workers,
            workers.preemptions_per_hour,
            log_dir=Path(config.deployment.run_dir) / WORKER_LOGS,
            run_config=Path(config.deployment.run_dir) / CONFIG_NAME,  # saved by execute before the pool starts
        ):
            yield


@contextlib.contextmanager
def remote_workers(resources: dict, max_usd: Optional[float] = None) -> Iterator[None]:
    """On a Redis queue: record the spot workers that relay their events through it
    (resources/cluster/worker_events.py), and publish the run's progress and spend there (for `spotlight status`
    and the spot workers' spend gate)."""
    from resources.cluster.worker_events import RemoteWorkers
    from resources.run_status import StatusPublisher

    with contextlib.closing(resources["queue"].get_queue()) as queue:
        if not hasattr(queue, "read_events"):  # a SQLite queue: only local workers, whose pipes the pool reads
            yield
            return
        ledger = resources["ledger"].get_ledger()
        with RemoteWorkers(queue, ledger), StatusPublisher(queue, ledger.query, {"max_usd": max_usd}):
            yield


def check_budget(ledger, max_usd: Optional[float], iteration: int) -> None:
    """BudgetReachedError once the run's spend (the ledger's run_cost) reached `max_usd` (None: no cap)."""
    from resources.run_status import ledger_status, over_budget

    with ledger.held():
        status = ledger_status(ledger.query)
    if over_budget(status, max_usd):
        when = f"after iteration {iteration}" if iteration >= 0 else "before its next iteration"
        raise BudgetReachedError(
            f"the run spent ${status['usd_total']:.4f}, reaching --max-usd {max_usd:g}, {when}; "
            "continue with --resume and a higher --max-usd"
        )


def trainer_threads(config: RunConfig) -> Optional[int]:
    """Torch threads of this process (trainer and validation): with a local cluster, the cores its workers
    (one thread each) leave, at least one; None = torch's default (also when OMP_NUM_THREADS is set).

    The workers sample while the trainer waits and explore while it trains, at a higher niceness
    (workers/coordinator/worker_pool.py), so the trainer's thread keeps its core. A trainer taking every core
    (OMP_NUM_THREADS=2 beside 2 workers) trained faster (10 s per cpu_tiny_spot update against 14 s) but left
    exploration too little CPU: 4.7 of 8 prompts explored per iteration against 7.9, explored seeds' variance
    gain 1.2x against 1.9x, and a smaller held-out gain (docs/BENCHMARKS.md, "make demo")."""
    if config.deployment.rollouts != "local_pool" or os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - config.workers.local_workers)


def pool_line(config: RunConfig, trainer_threads: int) -> str:
    """The line saying who samples: the pool's workers, where, and how often they are preempted."""
    from workers.coordinator.worker_pool import pool_devices

    w, train = config.workers, config.train
    places = pool_devices(train.device, train.nproc, w.local_workers)
    preempted = f"{w.preemptions_per_hour:g} preemptions per worker-hour, {w.notice_share:.0%} with notice"
    if not train.device.startswith("cuda"):
        return (
            f"rollouts on {len(places)} local spot workers ({w.worker_threads} thread(s) each, {preempted}); trainer "
            f"on {trainer_threads} thread(s)"
        )
    gpus = ", ".join(str(p.visible_devices) for p in places) or "none here: remote workers sample"
    return f"rollouts on {len(places)} local spot workers, one per GPU the trainer leaves (GPU {gpus}; {preempted})"


def execute(
    config: RunConfig,
    console,
    on_iteration=None,
    max_usd: Optional[float] = None,
    check_stop: Callable[[], None] = lambda: None,
) -> dict:
    """Walk every iteration not yet done; returns the summary (rows, report path, run cost). With `max_usd`, stops
    (BudgetReachedError) after the iteration during which the spend reached it. `check_stop` (a `StopSignals.check`,
    pipelines/run_stop.py) runs after each iteration's Dagster execution and raises to stop the run; any exception
    marks the run interrupted in the ledger."""
    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from pipelines.deploy import build_resources
    from pipelines.run_walk import dagster_home, dagster_ui_command, run_instance, walk_iterations
    from workers.coordinator import books

    run_dir = Path(config.deployment.run_dir)
    home = dagster_home(run_dir)  # a relative DAGSTER_HOME fails here, before any compute

    threads = trainer_threads(config)
    if threads is not None:
        torch.set_num_threads(threads)
    save_run_config(config)  # before the resources: local workers read it
    resources = build_resources(config)
    ledger = resources["ledger"].get_ledger()
    if books.close_dangling_workers(ledger):
        console.print("closed workers the interrupted run had left open")
    w = config.workers
    if config.deployment.rollouts == "local_pool" and w.local_workers:
        console.print(pool_line(config, torch.get_num_threads()))
    total = resources["run_config"].num_iterations + 1
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    try:
        check_budget(ledger, max_usd, -1)  # a resumed run may already be past it
        with (
            run_instance(run_dir) as instance,
            run_cluster(config, resources, max_usd),
            Progress(*columns, console=console, transient=True) as progress,
        ):
            task = progress.add_task("iterations", total=total)
            for outcome in walk_iterations(instance, resources, check_stop):
                progress.update(task, advance=1, description=f"iteration {outcome.iteration + 1}/{total - 1}")
                if on_iteration is not None:
                    on_iteration(outcome)
                check_hacking_stop(outcome)
                check_budget(ledger, max_usd, outcome.iteration)
    except BaseException:
        books.interrupt_run(ledger, resources["run_config"].run)
        raise
    console.print("Dagster UI (this run's materializations and checks):")
    console.print(dagster_ui_command(home), soft_wrap=True, markup=False, highlight=False)  # one line, to copy
    return {**summary(resources), "dagster_home": str(home)}


def summary(resources: dict) -> dict:
    from workers.coordinator.report import summary_rows

    ledger = resources["ledger"].get_ledger()
    cost = ledger.query("SELECT usd_total, usd_spot, usd_reserved FROM run_cost").as_dicts()[0]
    return {
        "rows": summary_rows(ledger),
        "cost": cost,
        "ledger": resources["ledger"].path,
        "report": str(Path(resources["ledger"].path).parent / "report" / "index.html"),
    }
