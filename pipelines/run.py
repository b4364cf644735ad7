"""`spotlight run`: a whole post-training run on this machine, walking the pipeline's assets iteration by iteration.

The run folder holds `run.json` (what was asked, so `--resume` continues the same run),
`ledger.duckdb`, `store/` (default), `queue.db` and `report/`. With `--rollouts
local_cluster` one cluster of rollout worker processes lives for the whole run, pulling
from the queue, preempted on a Poisson trace; the rollout assets then enqueue and wait.

Example:
    spec = RunSpec.resolve(Path("runs/demo"), resume=False, preset="cpu_tiny", iterations=None, ...)
    execute(spec, console)
"""

from __future__ import annotations

import contextlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional

SPEC_NAME = "run.json"


@dataclass(frozen=True)
class RunSpec:
    """What `spotlight run` was asked to do; stored in the run folder for --resume."""

    run_dir: str
    preset: str = "cpu_tiny"
    iterations: Optional[int] = None
    store: Optional[str] = None
    queue: Optional[str] = None
    rollouts: str = "inprocess"
    checkpoint: Optional[str] = None
    num_workers: int = 2
    preemptions_per_hour: float = 60.0

    @classmethod
    def resolve(cls, run_dir: Path, *, resume: bool, **asked) -> "RunSpec":
        """A new run's spec, or on --resume the stored one (flags given again must agree with it)."""
        path = run_dir / SPEC_NAME
        if not resume:
            if path.exists() or (run_dir / "ledger.duckdb").exists():
                raise ValueError(f"{run_dir} already holds a run; continue it with --resume or choose another --run-dir")
            return cls(str(run_dir), **{k: v for k, v in asked.items() if v is not None})
        if not path.is_file():
            raise ValueError(f"nothing to resume: {path} does not exist (start the run without --resume)")
        stored = cls(**json.loads(path.read_text()))
        clashes = {k: (v, getattr(stored, k)) for k, v in asked.items() if v is not None and v != getattr(stored, k)}
        if clashes:
            raise ValueError("--resume continues the stored run; these flags differ from it: "
                             + ", ".join(f"--{k.replace('_', '-')} {a!r} (run has {b!r})" for k, (a, b) in clashes.items()))
        return stored

    def save(self) -> None:
        Path(self.run_dir).mkdir(parents=True, exist_ok=True)
        (Path(self.run_dir) / SPEC_NAME).write_text(json.dumps(asdict(self), indent=2))

    def resources(self) -> dict:
        from pipelines.deploy import build_resources

        mode = "workers" if self.rollouts == "local_cluster" else self.rollouts
        return build_resources(run_dir=self.run_dir, preset=self.preset, iterations=self.iterations, store=self.store,
                               queue=self.queue, rollouts=mode, checkpoint=self.checkpoint)


def close_dangling_workers(ledger) -> int:
    """Workers a killed run left open end as interrupted at the ledger's last recorded moment (not now:
    the time the run was down is not billed)."""
    last = ledger.query("SELECT max(coalesce(ended_at, started_at)) FROM phases").rows[0][0]
    open_ids = [r[0] for r in ledger.query("SELECT worker_id FROM workers WHERE ended_at IS NULL AND worker_id NOT LIKE 'reserved-%'").rows]
    for worker_id in open_ids:
        ledger.end_worker(worker_id, reason="interrupted", at=last)
    return len(open_ids)


@contextlib.contextmanager
def run_cluster(spec: RunSpec, resources: dict) -> Iterator[None]:
    """With --rollouts local_cluster: worker processes for the whole run, preempted on a Poisson trace."""
    if spec.rollouts != "local_cluster":
        yield
        return
    from resources.cluster import ClusterConfig, LocalCluster, WorkerSlot
    from resources.preemption import poisson_trace

    workers = resources["rollout_workers"]
    slots = [WorkerSlot(f"w{i}", spot=True, usd_per_hour=workers.spot_usd_per_hour) for i in range(spec.num_workers)]
    config = ClusterConfig(resources["queue"].url, resources["store"].url, commit_every=workers.commit_every,
                           lease_s=workers.lease_s, restart_delay_s=workers.restart_delay_s,
                           log_dir=str(Path(spec.run_dir) / "worker_logs"))
    trace = poisson_trace([s.name for s in slots], rate_per_hour=spec.preemptions_per_hour, duration_s=6 * 3600,
                          notice_share=workers.notice_share, seed=0)
    stop = threading.Event()
    cluster = LocalCluster(config, slots, resources["ledger"].get_ledger())
    cluster.start()
    pump = threading.Thread(target=cluster.run_until, args=(stop.is_set,), kwargs={"trace": trace, "timeout_s": 6 * 3600},
                            daemon=True)
    pump.start()
    try:
        yield
    finally:
        stop.set()
        pump.join()
        cluster.stop()


def execute(spec: RunSpec, console, on_iteration=None) -> dict:
    """Walk every iteration not yet done; returns the summary (rows, report path, run cost)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    import dagster as dg

    from pipelines.run_walk import walk_iterations

    resources = spec.resources()
    spec.save()
    ledger = resources["ledger"].get_ledger()
    if close_dangling_workers(ledger):
        console.print("closed workers the interrupted run had left open")
    total = resources["run_config"].num_iterations + 1
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
    try:
        with run_cluster(spec, resources), Progress(*columns, console=console, transient=True) as progress:
            task = progress.add_task("iterations", total=total)
            for outcome in walk_iterations(dg.DagsterInstance.ephemeral(), resources):
                progress.update(task, advance=1, description=f"iteration {outcome.iteration + 1}/{total - 1}")
                if on_iteration is not None:
                    on_iteration(outcome)
    except BaseException:
        with contextlib.suppress(ValueError):  # no run row yet if iteration 0 never started
            ledger.end_run(resources["run_config"].run, status="interrupted")
        raise
    return summary(resources)


def summary(resources: dict) -> dict:
    from pipelines.report import summary_rows

    ledger = resources["ledger"].get_ledger()
    cost = ledger.query("SELECT usd_total, usd_spot, usd_reserved FROM run_cost").as_dicts()[0]
    return {"rows": summary_rows(ledger), "cost": cost, "ledger": resources["ledger"].path,
            "report": str(Path(resources["ledger"].path).parent / "report" / "index.html")}
