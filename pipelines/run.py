"""`spotlight run`: a whole post-training run on this machine, walking the pipeline's assets iteration by iteration.

The run folder holds `run.json` (what was asked, so `--resume` continues the same run),
`ledger.duckdb`, `store/` (default), `queue.db` and `report/`. By default (`--rollouts
local_pool`) one pool of rollout worker processes lives for the whole run, pulling
from the queue, preempted on a Poisson trace; the rollout assets then enqueue and wait.
`--rollouts inprocess` samples in this process instead (no workers, no preemptions).
Paths are stored absolute (relative ones mean relative to the directory `spotlight run` started
in), so worker processes and a later `--resume` from elsewhere find the same files.
With `--nproc N` the command (pipelines/run_cli.py) calls `execute` on rank 0 of N trainer processes
(pipelines/ranks_cli.py): the walk, the local cluster and every write are rank 0's, and Dagster's in-process
execution runs the train asset's step in that process, whose trainer setup orders the other ranks to join.

Example:
    spec = RunSpec.resolve(Path("runs/demo"), resume=False, preset="cpu_tiny_spot", iterations=None, ...)
    execute(spec, console)
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

from resources.settings import check_bounds, resource_settings, run_rollouts, settings_class, settings_of
from resources.urls import absolute_url
from workers.task.prompt_file import file_digest

SPEC_NAME = "run.json"
RESUME_MAY_CHANGE = (
    "nproc",
    "gradient_checkpointing",
    "rollout_batch",
    "micro_batch",
    "on_hacking",
    "reserved_usd_per_hour",
)
"""Flags a --resume may change: how each update is computed, not what (N ranks train what one process trains, and
chunks and micro-batches compute what the whole batch does, to float rounding), so a relaunch on another number or
size of GPUs continues the run (at that node's price); and what a reward-hacking flag does (a run stopped by one
continues with --on-hacking warn or rollback). Unset, they keep the stored values."""
SPEC_DEFAULTS = {"gradient_checkpointing": False, "on_hacking": None}
"""Where run.json's value differs from the setting's default: off unless asked (the command turns it on for the GPU
presets), and None (the resource's warn) as runs have always stored it."""
PATH_SETTINGS = tuple(s.name for s in settings_of("run") if s.path)

_RunSettings = settings_class("run", leading=(("run_dir", str),), defaults=SPEC_DEFAULTS)


@dataclass(frozen=True)
class RunSpec(_RunSettings):
    """What `spotlight run` was asked to do; stored in the run folder for --resume. Its fields: `run_dir` (absolute)
    and each setting of `spotlight run` (resources/settings/); store and queue URLs and path settings are made
    absolute, so worker processes and a later --resume from elsewhere find the same files."""

    def __post_init__(self) -> None:
        # Worker processes and a --resume from another directory must find the same files.
        object.__setattr__(self, "run_dir", str(Path(self.run_dir).expanduser().resolve()))
        for name in ("store", "queue"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, absolute_url(getattr(self, name)))
        for name in PATH_SETTINGS:
            if getattr(self, name) is not None:
                object.__setattr__(self, name, str(Path(getattr(self, name)).expanduser().resolve()))
        object.__setattr__(self, "rollouts", run_rollouts(self.rollouts))  # a legacy name reads as its mode
        check_bounds(self, "run")
        if self.num_workers < 0 or (
            self.num_workers == 0 and not (self.queue or "").startswith(("redis://", "rediss://"))
        ):
            raise ValueError(
                f"--workers must be >= 1, got {self.num_workers} (0 only on a Redis --queue, whose remote "
                "workers then sample everything: the reserved node of a --model run)"
            )
        if self.explore_samples is not None and (self.rollouts != "inprocess" or not self.explore_samples > 0):
            raise ValueError(
                f"--explore-samples (> 0, a budget in samples) is for --rollouts inprocess, got "
                f"{self.explore_samples} with --rollouts {self.rollouts} (its workers explore on their own time)"
            )
        if not self.preemptions_per_hour >= 0:
            raise ValueError(f"--preemptions-per-hour must be >= 0, got {self.preemptions_per_hour}")
        if self.nproc < 1:
            raise ValueError(f"--nproc must be >= 1 (trainer processes; one per GPU on CUDA), got {self.nproc}")

    @classmethod
    def resolve(cls, run_dir: Path, *, resume: bool, replace: bool = False, **asked) -> "RunSpec":
        """A new run's spec, or on --resume the stored one (flags given again must agree with it, but for those of
        RESUME_MAY_CHANGE, which replace the stored values); --resume on a
        folder without a run starts one. `replace`: a new run that will replace the one in `run_dir` (the caller
        deletes it)."""
        path = run_dir / SPEC_NAME
        if not resume:
            if not replace and (path.exists() or (run_dir / "ledger.duckdb").exists()):
                raise ValueError(
                    f"{run_dir} already holds a run; continue it with --resume or choose another --run-dir"
                )
            return cls(str(run_dir), **{k: v for k, v in asked.items() if v is not None})
        if not path.is_file():
            if (run_dir / "ledger.duckdb").exists():
                raise ValueError(
                    f"{run_dir} holds a ledger but no {SPEC_NAME}: it was not written by `spotlight run`; "
                    "choose another --run-dir"
                )
            # Resume-or-start: a node that runs `spotlight run --resume` on every (re)start begins the run the first
            # time.
            return cls(str(run_dir), **{k: v for k, v in asked.items() if v is not None})
        # The folder is where it is now (it may have moved); flags compare as the spec stores them (absolute paths).
        stored = dataclasses.replace(cls(**json.loads(path.read_text())), run_dir=str(run_dir))
        given = asdict(dataclasses.replace(stored, **{k: v for k, v in asked.items() if v is not None}))
        clashes = {
            k: (asked[k], getattr(stored, k))
            for k in asked
            if asked[k] is not None and k not in RESUME_MAY_CHANGE and given[k] != getattr(stored, k)
        }
        if clashes:
            raise ValueError(
                "--resume continues the stored run; these flags differ from it: "
                + ", ".join(f"--{k.replace('_', '-')} {a!r} (run has {b!r})" for k, (a, b) in clashes.items())
            )
        resumed = dataclasses.replace(stored, **{k: asked[k] for k in RESUME_MAY_CHANGE if asked.get(k) is not None})
        resumed.check_prompts_unchanged()
        return resumed

    def save(self) -> None:
        """run.json, readable by its owner only (0600): a queue URL given with its password keeps it here. The
        first save of a run with --prompts also records the file's digest (PROMPTS_DIGEST_NAME), for --resume."""
        Path(self.run_dir).mkdir(parents=True, exist_ok=True)
        path = Path(self.run_dir) / SPEC_NAME
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # a run.json written before (0644) is narrowed too
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(asdict(self), indent=2))
        digest = Path(self.run_dir) / PROMPTS_DIGEST_NAME
        if self.prompts is not None and not digest.exists():
            digest.write_text(json.dumps({"path": self.prompts, "digest": file_digest(Path(self.prompts))}))

    def check_prompts_unchanged(self) -> None:
        """ValueError when the --prompts file differs from the one the run started on: a resumed run would draw
        its prompts from the new file, so what was trained and what is trained next would be two tasks."""
        recorded = Path(self.run_dir) / PROMPTS_DIGEST_NAME
        if self.prompts is None or not recorded.is_file():
            return
        if file_digest(Path(self.prompts)) != json.loads(recorded.read_text())["digest"]:
            raise ValueError(
                f"--prompts {self.prompts} changed since the run started (its digest differs from the one in "
                f"{recorded}); restore the file to continue this run, or start a new run (another --run-dir) "
                "on the new file"
            )

    def resources(self) -> dict:
        """The Dagster resources of this run: its settings that are RunConfigResource fields, the pool's workers
        already pulling (`workers` sampling) or in-process sampling."""
        from pipelines.deploy import build_resources

        return build_resources(
            run_dir=self.run_dir,
            store=self.store,
            queue=self.queue,
            rollouts="workers" if self.rollouts == "local_pool" else self.rollouts,
            workers={"notice_share": self.notice_share}
            | ({} if self.explore_samples is None else {"explore_samples": self.explore_samples}),
            **{s.name: getattr(self, s.name) for s in resource_settings() if s.name in RUN_FIELDS},
        )


RUN_FIELDS = frozenset(s.name for s in settings_of("run"))
PROMPTS_DIGEST_NAME = "prompts.digest.json"
"""In the run folder: the --prompts file's path and blake2b digest when the run started."""


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
def run_cluster(spec: RunSpec, resources: dict, max_usd: Optional[float] = None) -> Iterator[None]:
    """With --rollouts local_pool: worker processes for the whole run, preempted on a Poisson trace."""
    with remote_workers(resources, max_usd):
        if spec.rollouts != "local_pool" or spec.num_workers == 0:
            yield
            return
        from assets.context import run_context
        from workers.coordinator.worker_pool import worker_pool

        with worker_pool(
            run_context(**resources),
            spec.num_workers,
            spec.preemptions_per_hour,
            log_dir=Path(spec.run_dir) / "worker_logs",
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

    status = ledger_status(ledger.query)
    if over_budget(status, max_usd):
        when = f"after iteration {iteration}" if iteration >= 0 else "before its next iteration"
        raise BudgetReachedError(
            f"the run spent ${status['usd_total']:.4f}, reaching --max-usd {max_usd:g}, {when}; "
            "continue with --resume and a higher --max-usd"
        )


def trainer_threads(spec: RunSpec) -> Optional[int]:
    """Torch threads of this process (trainer and validation): with a local cluster, the cores its workers
    (one thread each) leave, at least one; None = torch's default (also when OMP_NUM_THREADS is set).

    The workers sample while the trainer waits and explore while it trains, at a higher niceness
    (workers/coordinator/worker_pool.py), so the trainer's thread keeps its core. A trainer taking every core
    (OMP_NUM_THREADS=2 beside 2 workers) trained faster (10 s per cpu_tiny_spot update against 14 s) but left
    exploration too little CPU: 4.7 of 8 prompts explored per iteration against 7.9, explored seeds' variance
    gain 1.2x against 1.9x, and a smaller held-out gain (docs/BENCHMARKS.md, "make demo")."""
    if spec.rollouts != "local_pool" or os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - spec.num_workers)


def execute(
    spec: RunSpec,
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

    from pipelines.run_walk import dagster_home, dagster_ui_command, run_instance, walk_iterations
    from workers.coordinator import books

    home = dagster_home(Path(spec.run_dir))  # a relative DAGSTER_HOME fails here, before any compute

    threads = trainer_threads(spec)
    if threads is not None:
        torch.set_num_threads(threads)
    resources = spec.resources()
    spec.save()
    ledger = resources["ledger"].get_ledger()
    if books.close_dangling_workers(ledger):
        console.print("closed workers the interrupted run had left open")
    if spec.rollouts == "local_pool" and spec.num_workers:
        console.print(
            f"rollouts on {spec.num_workers} local spot workers (1 thread each, {spec.preemptions_per_hour:g} "
            f"preemptions per worker-hour, {spec.notice_share:.0%} with notice); trainer on "
            f"{torch.get_num_threads()} thread(s)"
        )
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
            run_instance(Path(spec.run_dir)) as instance,
            run_cluster(spec, resources, max_usd),
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
