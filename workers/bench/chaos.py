"""`spotlight bench chaos`: a soak of many iterations on the local cluster under heavy preemption,
checked against a fault-free run.

One LocalCluster of rollout worker processes serves every iteration, as `spotlight run`'s run-long workers do, while a
Poisson trace SIGTERMs (with notice) or SIGKILLs them at `preemptions_per_hour` per worker; capacity comes back after
`restart_delay_s`. Iteration k's requests go on the queue when k-1's are done, and the coordinator's purge of
consumed iterations runs as in workers/coordinator/rollout_dispatch.py. Requests are fixed (prompt, seed, weights
version 0), which is what fixing exploration's seed plans gives a real run, so the fault-free run (the same requests
worked in this process, never interrupted) asks for the same samples.

Reported: requests, lost (no committed result or never acked), duplicated (acked as first more than once), result-hash
mismatches against the fault-free run, dead letters, preemptions (with and without notice), preemptions per spot
worker-hour (the ledger's worker lifetimes), steps lost, attempts resumed from a committed step, wall time. With
`queue="redis"` the queue is a redis-server of the bench's own (AOF on), restarted every `redis_restart_every_s` while
the workers use it.

Example:
    figures = run_chaos_bench(ChaosBench.quick())
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

from resources.cluster import ClusterConfig, LocalCluster, WorkerSlot
from resources.cluster.ledger import result_records
from resources.cluster.preemption import poisson_trace
from resources.ledger import Ledger
from resources.queue import open_queue
from resources.queue.base import RequestQueue
from resources.queue.records import Request
from resources.store.local import LocalTensorStore

PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a yellow circle", "three purple circles"]


@dataclass(frozen=True)
class ChaosBench:
    """What `spotlight bench chaos` runs."""

    num_iterations: int = 20
    """Iterations of the soak, one batch of requests each."""
    num_workers: int = 2
    """Spot worker slots (every one is preemptible)."""
    requests_per_iteration: int = 8
    """Rollout requests per iteration."""
    num_steps: int = 8
    """Denoising steps per request."""
    commit_every: int = 2
    """Steps between state commits."""
    step_delay_s: float = 0.06
    """Extra seconds per step (a slower device), so that preemptions find requests in flight."""
    preemptions_per_hour: float = 240.0
    """Rate of the Poisson trace per worker slot-hour."""
    notice_share: float = 0.5
    """Share of preemptions that come with a notice (SIGTERM, then SIGKILL 2 s later); the rest are SIGKILLs."""
    lease_s: float = 3.0
    """Queue lease: how long a SIGKILLed worker's request waits before another worker resumes it."""
    restart_delay_s: float = 1.0
    """Seconds until a preempted slot gets a new worker."""
    queue: str = "sqlite"
    """sqlite (a file) or redis (a redis-server of the bench's own, appendonly yes)."""
    redis_restart_every_s: float = 0.0
    """With queue=redis: restart the server this often during the soak (0: never)."""
    seed: int = 0
    """Seed of the preemption trace."""
    timeout_s: float = 1200.0
    """Give up (reported as not completed) after this long."""

    def __post_init__(self) -> None:
        for name in ("num_iterations", "num_workers", "requests_per_iteration", "num_steps", "commit_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"ChaosBench.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("step_delay_s", "preemptions_per_hour", "restart_delay_s", "redis_restart_every_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"ChaosBench.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.notice_share <= 1:
            raise ValueError(f"ChaosBench.notice_share must lie in [0, 1], got {self.notice_share}")
        if not (self.lease_s > 0 and self.timeout_s > 0):
            raise ValueError("ChaosBench.lease_s and timeout_s must be > 0")
        if self.queue not in ("sqlite", "redis"):
            raise ValueError(f"ChaosBench.queue must be sqlite or redis, got {self.queue!r}")
        if self.redis_restart_every_s and self.queue != "redis":
            raise ValueError("ChaosBench.redis_restart_every_s needs queue=redis")

    @classmethod
    def quick(cls, **changes: Any) -> "ChaosBench":
        """Two short iterations at a high rate: a smoke run of every path (about a minute)."""
        return replace(cls(num_iterations=2, requests_per_iteration=4, preemptions_per_hour=900.0, seed=1), **changes)


def run_chaos_bench(
    bench: ChaosBench = ChaosBench(), progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Run the soak and its fault-free reference; every figure as one JSON-ready dict."""
    with tempfile.TemporaryDirectory(prefix="spotlight-bench-chaos-") as tmp:
        folder = Path(tmp)
        store = _store(folder / "store")
        requests = [_requests(bench, k) for k in range(bench.num_iterations)]
        progress(f"fault-free reference: {bench.num_iterations * bench.requests_per_iteration} requests in process")
        expected = _fault_free_hashes(_store(folder / "reference"), requests, bench.num_steps)
        server = _Queue(bench, folder)
        with server as queue_url:
            progress(
                f"soak: {bench.num_iterations} iterations on {bench.num_workers} workers at "
                f"{bench.preemptions_per_hour:g} preemptions per worker-hour ({bench.queue} queue)"
            )
            soak = _soak(
                bench, folder, store, queue_url, requests, server.restart if bench.queue == "redis" else None, progress
            )
        soak.redis_restarts = server.restarts
        figures = _figures(bench, soak, store, requests, expected, folder / "ledger.duckdb")
    return figures


def _store(path: Path) -> LocalTensorStore:
    from workers.model.tiny_policy import PolicyConfig, build_policy
    from workers.rollout.weights import publish_policy

    store = LocalTensorStore(path)
    config = PolicyConfig(image_size=16, num_layers=1, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
    publish_policy(store, "chaos", build_policy(config, seed=0).eval())
    return store


def _requests(bench: ChaosBench, iteration: int) -> list[dict]:
    from workers.algo.sampler import SamplerConfig
    from workers.rollout.state import RolloutSpec, rollout_request

    sampler = SamplerConfig(num_steps=bench.num_steps, noise_level=0.7)
    n = bench.requests_per_iteration
    return [
        rollout_request(
            f"it{iteration}-r{i:03d}",
            iteration,
            RolloutSpec("chaos", PROMPTS[i % len(PROMPTS)], 10_000 * iteration + i, 0, sampler),
        )
        for i in range(n)
    ]


def _fault_free_hashes(store: LocalTensorStore, requests: list[list[dict]], num_steps: int) -> dict[str, str]:
    """Each request worked once, start to end, in this process: what every soak result must equal."""
    from workers.rollout.request import work_request
    from workers.rollout.weights import PolicyHolder

    holder = PolicyHolder(store)
    return {
        r["request_id"]: work_request(
            Request.from_dict(r), 1, store, holder, worker_id="reference", commit_every=num_steps
        ).result_hash
        for batch in requests
        for r in batch
    }


class _Queue:
    """The soak's queue URL: a SQLite file, or a redis-server of its own (AOF on) that `restart` restarts."""

    def __init__(self, bench: ChaosBench, folder: Path) -> None:
        self.bench, self.folder, self.process = bench, folder, None
        self.restarts = 0

    def __enter__(self) -> str:
        if self.bench.queue == "sqlite":
            return str(self.folder / "queue.db")
        binary = shutil.which("redis-server")
        if binary is None:
            raise ValueError("queue=redis needs redis-server on PATH (apt-get install redis-server)")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        (self.folder / "redis").mkdir()
        self.args = [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--dir",
            str(self.folder / "redis"),
        ]
        self.url = f"redis://127.0.0.1:{port}/0"
        self._start()
        return self.url

    def _start(self) -> None:
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection(("127.0.0.1", int(self.args[2])), timeout=1):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def restart(self) -> None:
        """SIGTERM (the server flushes its AOF), then start it again on the same port and folder."""
        self.process.terminate()
        self.process.wait(timeout=30)
        self._start()
        self.restarts += 1

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=30)


@dataclass
class _Soak:
    wall_s: float
    completed: bool
    iterations_done: int
    results: dict[str, str]
    dead_letters: int
    summary: Any
    events: list[dict]
    redis_restarts: int = 0
    done_rows_max: int = 0
    window: tuple[float, float] = (0.0, 0.0)
    """Wall-clock start and end of the trace (after the first workers were ready)."""


class _Iterations:
    """`run_until`'s done-check: puts iteration k+1 once k is finished,
    purging consumed iterations as the coordinator does."""

    def __init__(
        self,
        queue: RequestQueue,
        requests: list[list[dict]],
        restart: Callable[[], None] | None,
        restart_every_s: float,
    ) -> None:
        self.queue, self.requests, self.k = queue, requests, 0
        self.results: dict[str, str] = {}
        self.restart, self.restart_every_s, self.last_restart = restart, restart_every_s, time.monotonic()
        self.done_rows_max = 0
        queue.put(requests[0])

    def __call__(self) -> bool:
        if (
            self.restart is not None
            and self.restart_every_s
            and time.monotonic() - self.last_restart >= self.restart_every_s
        ):
            self.restart()
            self.last_restart = time.monotonic()
        ids = [r["request_id"] for r in self.requests[self.k]]
        if not self.queue.wait_until_done(ids, timeout_s=0).complete:
            return False
        self.results.update(self.queue.results(ids))
        if self.k >= 2:
            self.queue.purge_finished(before_iteration=self.k - 1)
        self.done_rows_max = max(self.done_rows_max, self.queue.stats().done)
        self.k += 1
        if self.k == len(self.requests):
            return True
        self.queue.put(self.requests[self.k])
        return False


def _soak(
    bench: ChaosBench,
    folder: Path,
    store: LocalTensorStore,
    queue_url: str,
    requests: list[list[dict]],
    restart: Callable[[], None] | None,
    progress: Callable[[str], None],
) -> _Soak:
    slots = [
        WorkerSlot(f"w{i}", instance_type="local-cpu", spot=True, usd_per_hour=0.4, step_delay_s=bench.step_delay_s)
        for i in range(bench.num_workers)
    ]
    config = ClusterConfig(
        queue_url,
        str(store.root),
        commit_every=bench.commit_every,
        lease_s=bench.lease_s,
        restart_delay_s=bench.restart_delay_s,
        log_dir=str(folder / "logs"),
        ready_timeout_s=600,
    )
    trace = poisson_trace(
        [s.name for s in slots],
        rate_per_hour=bench.preemptions_per_hour,
        duration_s=bench.timeout_s,
        notice_share=bench.notice_share,
        seed=bench.seed,
    )
    with open_queue(queue_url) as queue, Ledger(folder / "ledger.duckdb") as ledger:
        with LocalCluster(config, slots, ledger) as cluster:
            progress("workers ready; the trace starts")
            iterations = _Iterations(queue, requests, restart, bench.redis_restart_every_s)
            started = time.time()
            summary = cluster.run_until(iterations, trace=trace, timeout_s=bench.timeout_s)
            window = (started, time.time())
        return _Soak(
            summary.wall_s,
            summary.completed,
            iterations.k,
            iterations.results,
            len(queue.dead_letters()),
            summary,
            list(cluster.tracker.events),
            done_rows_max=iterations.done_rows_max,
            window=window,
        )


def _figures(
    bench: ChaosBench,
    soak: _Soak,
    store: LocalTensorStore,
    requests: list[list[dict]],
    expected: dict[str, str],
    ledger_path: Path,
) -> dict[str, Any]:
    flat = [r for batch in requests for r in batch]
    hashes = {r.request_id: r.result_hash for r in result_records(store, flat)}
    firsts = Counter(e["request_id"] for e in soak.events if e["event"] == "acked" and e["first"])
    ids = [r["request_id"] for r in flat]
    lost = [rid for rid in ids if rid not in hashes or firsts[rid] == 0 or rid not in soak.results]
    duplicated = [rid for rid in ids if firsts[rid] > 1]
    mismatched = [rid for rid in ids if rid in hashes and hashes[rid] != expected[rid]]
    with Ledger(ledger_path) as ledger:
        lifetimes = ledger.query(
            "SELECT epoch_ms(started_at) / 1000.0, epoch_ms(ended_at) / 1000.0 FROM workers WHERE spot"
        ).rows
    # Worker-hours inside the trace's window (start-up before it and the final stop after it excluded).
    begin, end = soak.window
    spot_s = sum(max(0.0, min(e if e is not None else end, end) - max(s, begin)) for s, e in lifetimes)
    preemptions = soak.summary.preemptions
    resumed = sum(1 for e in soak.events if e["event"] == "claim" and e.get("resumed_from_step", 0) > 0)
    return {
        "config": asdict(bench),
        "machine": _machine(),
        "completed": soak.completed,
        "iterations_done": soak.iterations_done,
        "requests": len(ids),
        "lost": len(lost),
        "duplicated": len(duplicated),
        "hash_mismatches": len(mismatched),
        "hash_checked": sum(rid in hashes for rid in ids),
        "dead_letters": soak.dead_letters,
        "preemptions": len(preemptions),
        "preemptions_with_notice": sum(p.notice_s > 0 for p in preemptions),
        "trace_events_skipped": soak.summary.skipped_events,
        "preemptions_per_worker_hour": round(len(preemptions) / (spot_s / 3600), 1) if spot_s > 0 else None,
        "spot_worker_hours": round(spot_s / 3600, 4),
        "workers_started": soak.summary.workers_started,
        "steps_lost": sum(p.steps_lost for p in preemptions),
        "resumed_from_commit": resumed,
        "attempts": sum(1 for e in soak.events if e["event"] == "claim"),
        "redis_restarts": soak.redis_restarts,
        "done_rows_max": soak.done_rows_max,
        "wall_s": round(soak.wall_s, 1),
        "examples": {"lost": lost[:5], "duplicated": duplicated[:5], "mismatched": mismatched[:5]},
    }


def _machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}


def format_chaos_report(f: dict[str, Any]) -> str:
    """The figures as a few lines of text."""
    c = f["config"]
    lines = [
        f"soak: {f['iterations_done']}/{c['num_iterations']} iterations, "
        f"{f['requests']} requests on {c['num_workers']} "
        f"workers ({c['queue']} queue), {f['wall_s']} s, {'completed' if f['completed'] else 'NOT completed'}",
        f"preemptions: {f['preemptions']} ({f['preemptions_with_notice']} with notice) = "
        f"{f['preemptions_per_worker_hour']} per worker-hour over {f['spot_worker_hours']} worker-hours; "
        f"{f['workers_started']} workers started; {f['steps_lost']} steps lost; "
        f"{f['resumed_from_commit']} of {f['attempts']} attempts resumed from a commit",
        f"lost {f['lost']}, duplicated {f['duplicated']}, hash mismatches {f['hash_mismatches']} "
        f"of {f['hash_checked']} checked against the fault-free run, dead letters {f['dead_letters']}",
    ]
    if c["queue"] == "redis":
        lines.append(f"redis restarts during the soak: {f['redis_restarts']}")
    return "\n".join(lines)
