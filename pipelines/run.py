"""`spotlight run`: a whole post-training run on this machine, walking the pipeline's assets iteration by iteration.

The run folder holds `run.json` (what was asked, so `--resume` continues the same run),
`ledger.duckdb`, `store/` (default), `queue.db` and `report/`. By default (`--rollouts
local_cluster`) one cluster of rollout worker processes lives for the whole run, pulling
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
from typing import Iterator, Optional

from resources.urls import absolute_url

SPEC_NAME = "run.json"
ROLLOUT_MODES = ("local_cluster", "inprocess")
DEFAULT_WORKERS = 2
"""One single-threaded worker per core of a 2-core machine: the trainer waits while they sample."""
DEFAULT_PREEMPTIONS_PER_HOUR = 12.0
"""Per spot worker-hour, Poisson, half of them without notice: far more often than clouds preempt, so that a
default run (8-12 min, 2 workers) sees a few and its report shows what they cost."""
BATCH_FIELDS = ("rollout_batch", "micro_batch", "group_size", "prompts_per_iteration", "minibatches", "advantage")
"""The run's batch shape and advantage beyond the preset (RunConfigResource's fields of the same names)."""
RESUME_MAY_CHANGE = ("nproc", "gradient_checkpointing", "rollout_batch", "micro_batch", "on_hacking")
"""Flags a --resume may change: how each update is computed, not what (N ranks train what one process trains, and
chunks and micro-batches compute what the whole batch does, to float rounding), so a relaunch on another number or
size of GPUs continues the run; and what a reward-hacking flag does (a run stopped by one continues with
--on-hacking warn or rollback). Unset, they keep the stored values."""
HACKING_FIELDS = (
    "on_hacking",
    "hacking_window",
    "hacking_z",
    "hacking_max_drop",
    "hacking_max_rise",
    "rollback_lr_scale",
    "rollback_kl_beta",
)


@dataclass(frozen=True)
class RunSpec:
    """What `spotlight run` was asked to do; stored in the run folder for --resume."""

    run_dir: str
    """The run folder, absolute (a relative one is resolved against the current directory)."""
    preset: str = "cpu_tiny_spot"
    iterations: Optional[int] = None
    seed: Optional[int] = None
    """Run seed (prompt schedule and request seeds); None = the preset's."""
    reward: Optional[str] = None
    store: Optional[str] = None
    """Tensor store URL; a local path is made absolute. None = RUN_DIR/store."""
    queue: Optional[str] = None
    """Queue URL; a local path is made absolute. None = RUN_DIR/queue.db."""
    rollouts: str = "local_cluster"
    explore_samples: Optional[float] = None
    """--rollouts inprocess: explore in this process on a budget of this many full-sampler samples per iteration."""
    checkpoint: Optional[str] = None
    model: Optional[str] = None
    """A diffusers pipeline folder (absolute), with the ModelSpec fields below; None: the pixel policy."""
    lora_rank: Optional[int] = None
    resolution: Optional[int] = None
    guidance: Optional[float] = None
    sync_mode: Optional[str] = None
    """With a LoRA: what PULSE ships to the workers, lora (the adapter) or merged (BF16 base + delta); None = lora."""
    device: str = "cpu"
    """The trainer's device (in-process sampling and validation too); the local workers stay on the CPU."""
    nproc: int = 1
    """Trainer processes (one per GPU on CUDA): rank 0 runs the walk, the others join each update (FSDP2)."""
    gradient_checkpointing: bool = False
    """Recompute each transformer block in backward."""
    num_workers: int = DEFAULT_WORKERS
    preemptions_per_hour: float = DEFAULT_PREEMPTIONS_PER_HOUR
    validation_reward: Optional[str] = None
    """Reward that scores the held-out images; None = the detector (pixel policy) or the run's reward (--model)."""
    validation_prompts: Optional[str] = None
    """A file of held-out prompts, one a line (absolute); None = MiniGenEval's held-out split."""
    prompts: Optional[str] = None
    """The training prompts file (absolute; workers/task/prompt_file.py); None = MiniGenEval's grammar."""
    prompts_heldout: Optional[float] = None
    """With prompts: the share held out for validation (None = 0)."""
    rollout_batch: Optional[int] = None
    """Samples sampled and VAE-decoded together in the trainer's process; None = the preset's."""
    micro_batch: Optional[int] = None
    """Samples per forward and backward in the update; None = the preset's."""
    group_size: Optional[int] = None
    prompts_per_iteration: Optional[int] = None
    minibatches: Optional[int] = None
    advantage: Optional[str] = None
    """What the advantages normalise: total (None) or per-component (each component of a multi: reward)."""
    on_hacking: Optional[str] = None
    """What a reward-hacking flag does: warn (None), stop or rollback (docs/REWARD_HACKING.md)."""
    hacking_window: Optional[int] = None
    hacking_z: Optional[float] = None
    hacking_max_drop: Optional[float] = None
    hacking_max_rise: Optional[float] = None
    rollback_lr_scale: Optional[float] = None
    rollback_kl_beta: Optional[float] = None

    def __post_init__(self) -> None:
        # Worker processes and a --resume from another directory must find the same files.
        object.__setattr__(self, "run_dir", str(Path(self.run_dir).expanduser().resolve()))
        for name in ("store", "queue"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, absolute_url(getattr(self, name)))
        for name in ("checkpoint", "model", "validation_prompts", "prompts"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, str(Path(getattr(self, name)).expanduser().resolve()))
        if self.rollouts not in ROLLOUT_MODES:
            raise ValueError(f"--rollouts must be one of {ROLLOUT_MODES}, got {self.rollouts!r}")
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
            # Resume-or-start: a node that runs `spotlight run --resume` on every (re)start begins the run the first time.
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
        return dataclasses.replace(stored, **{k: asked[k] for k in RESUME_MAY_CHANGE if asked.get(k) is not None})

    def save(self) -> None:
        """run.json, readable by its owner only (0600): a queue URL given with its password keeps it here."""
        Path(self.run_dir).mkdir(parents=True, exist_ok=True)
        path = Path(self.run_dir) / SPEC_NAME
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # a run.json written before (0644) is narrowed too
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(asdict(self), indent=2))

    def resources(self) -> dict:
        from pipelines.deploy import build_resources

        mode = "workers" if self.rollouts == "local_cluster" else self.rollouts
        return build_resources(
            run_dir=self.run_dir,
            preset=self.preset,
            iterations=self.iterations,
            seed=self.seed,
            reward=self.reward,
            store=self.store,
            queue=self.queue,
            rollouts=mode,
            checkpoint=self.checkpoint,
            workers=None if self.explore_samples is None else {"explore_samples": self.explore_samples},
            # Always every field: one without --model is refused (run_config), not dropped.
            model={
                "model": self.model,
                "lora_rank": self.lora_rank,
                "resolution": self.resolution,
                "guidance": self.guidance,
                "sync_mode": self.sync_mode,
            },
            device=self.device,
            validation={
                "validation_reward": self.validation_reward,
                "validation_prompts": self.validation_prompts,
                **{name: getattr(self, name) for name in HACKING_FIELDS if getattr(self, name) is not None},
            },
            prompts={"prompts": self.prompts, "prompts_heldout": self.prompts_heldout},
            batch={k: getattr(self, k) for k in BATCH_FIELDS if getattr(self, k) is not None},
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
def run_cluster(spec: RunSpec, resources: dict, max_usd: Optional[float] = None) -> Iterator[None]:
    """With --rollouts local_cluster: worker processes for the whole run, preempted on a Poisson trace."""
    with remote_workers(resources, max_usd):
        if spec.rollouts != "local_cluster" or spec.num_workers == 0:
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
    """On a Redis queue: record the spot workers that relay their events through it (resources/cluster/worker_events.py),
    and publish the run's progress and spend there (for `spotlight status` and the spot workers' spend gate)."""
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
    if spec.rollouts != "local_cluster" or os.environ.get("OMP_NUM_THREADS"):
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - spec.num_workers)


def execute(spec: RunSpec, console, on_iteration=None, max_usd: Optional[float] = None) -> dict:
    """Walk every iteration not yet done; returns the summary (rows, report path, run cost). With `max_usd`, stops
    (BudgetReachedError) after the iteration during which the spend reached it."""
    import dagster as dg
    import torch
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from pipelines.run_walk import walk_iterations
    from workers.coordinator import books

    threads = trainer_threads(spec)
    if threads is not None:
        torch.set_num_threads(threads)
    resources = spec.resources()
    spec.save()
    ledger = resources["ledger"].get_ledger()
    if books.close_dangling_workers(ledger):
        console.print("closed workers the interrupted run had left open")
    if spec.rollouts == "local_cluster" and spec.num_workers:
        console.print(
            f"rollouts on {spec.num_workers} local spot workers (1 thread each, {spec.preemptions_per_hour:g} "
            f"preemptions per worker-hour); trainer on {torch.get_num_threads()} thread(s)"
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
        with run_cluster(spec, resources, max_usd), Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("iterations", total=total)
            for outcome in walk_iterations(dg.DagsterInstance.ephemeral(), resources):
                progress.update(task, advance=1, description=f"iteration {outcome.iteration + 1}/{total - 1}")
                if on_iteration is not None:
                    on_iteration(outcome)
                check_hacking_stop(outcome)
                check_budget(ledger, max_usd, outcome.iteration)
    except BaseException:
        books.interrupt_run(ledger, resources["run_config"].run)
        raise
    return summary(resources)


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
