"""`spotlight bench coordinator`: can one coordinator keep up with a big spot pool? Queue claims, ledger rows, overhead.

Three measurements on this machine, all through the real clients (no mocks):

1. Claims/s with `num_requests` (default 10^5) requests pending: SQLite (a file in a temp
   folder) and Redis (a `redis-server` started here on a free port, no persistence), one
   process claiming one request at a time with `num_workers` leases out (each worker holds
   one), then with every claim kept leased; puts/s and acks/s beside.
2. Ledger rows/s: attempt rows recorded one call at a time inside a phase (buffered,
   written at the phase end) against the same rows outside a phase (a connection each).
3. The coordinator's share of a simulated 64-worker iteration. The workers' compute is
   simulated (each request takes `num_steps` x `step_s` seconds; training takes as long as
   the rollouts): what is measured for real is everything the coordinator does for such an
   iteration: putting the requests, taking in every event the workers print (claim, step,
   commit, done: the local cluster's WorkTracker writing attempt rows), polling the queue
   every `poll_s` for the rollout phase's length, the request, train-step, sync and
   validation rows, the phase records and the cost queries. Share = measured coordinator
   seconds / (simulated worker seconds + measured coordinator seconds).

Example:
    figures = run_coordinator_bench(CoordinatorBench(num_requests=10_000))
"""

from __future__ import annotations

import platform
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from resources.cluster.ledger import WorkTracker
from resources.ledger import Ledger
from resources.ledger.records import AttemptRecord, RequestRecord, SyncRecord, TrainStepRecord
from resources.queue import open_queue
from resources.queue.base import RequestQueue


@dataclass(frozen=True)
class CoordinatorBench:
    """What `spotlight bench coordinator` measures."""

    num_requests: int = 100_000
    """Requests in the queue while claims are timed."""
    num_claims: int = 5_000
    """Claims (and then acks) timed against that queue."""
    num_ledger_rows: int = 20_000
    """Attempt rows recorded inside a phase (batched)."""
    num_unbatched_rows: int = 50
    """Attempt rows recorded outside a phase (one connection each), for comparison."""
    num_workers: int = 64
    """Spot workers of the simulated iteration."""
    requests_per_worker: int = 8
    """Rollout requests per worker per iteration."""
    num_steps: int = 10
    """Denoising steps per request (one `step` event each)."""
    commit_every: int = 2
    """In-flight state commits every this many steps (one `commit` event each)."""
    step_s: float = 2.0
    """Simulated seconds per denoising step (a 20B DiT step on one GPU is of this order)."""
    poll_s: float = 0.2
    """The coordinator's queue polling period while it waits for the rollouts."""
    redis: bool = True
    """Also measure Redis (needs redis-server on PATH; skipped with a note if absent)."""

    def __post_init__(self) -> None:
        for name in (
            "num_requests",
            "num_claims",
            "num_ledger_rows",
            "num_unbatched_rows",
            "num_workers",
            "requests_per_worker",
            "num_steps",
            "commit_every",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"CoordinatorBench.{name} must be >= 1, got {getattr(self, name)}")
        if 2 * self.num_claims + self.num_workers > self.num_requests:
            raise ValueError(
                f"CoordinatorBench: 2 x num_claims + num_workers ({2 * self.num_claims + self.num_workers}) "
                f"must be <= num_requests ({self.num_requests}): each claim takes a request"
            )
        if not (self.step_s > 0 and self.poll_s > 0):
            raise ValueError("CoordinatorBench.step_s and poll_s must be > 0")


def run_coordinator_bench(
    bench: CoordinatorBench = CoordinatorBench(), progress: Callable[[str], None] = lambda _: None
) -> dict[str, Any]:
    """Every figure of the coordinator bench as one JSON-ready dict."""
    figures: dict[str, Any] = {"config": asdict(bench), "machine": _machine()}
    with tempfile.TemporaryDirectory(prefix="spotlight-bench-coordinator-") as tmp:
        folder = Path(tmp)
        progress(f"SQLite queue: {bench.num_requests} requests")
        with open_queue(folder / "queue.db") as queue:
            figures["queue_sqlite"] = bench_claims(queue, bench)
        if bench.redis:
            progress("Redis queue (a redis-server of its own)")
            figures["queue_redis"] = _bench_redis(folder, bench)
        progress(f"ledger: {bench.num_ledger_rows} rows")
        figures["ledger"] = bench_ledger(folder / "ledger.duckdb", bench)
        progress(f"a simulated {bench.num_workers}-worker iteration")
        figures["iteration"] = simulate_iteration(folder / "iteration", bench)
    return figures


def bench_claims(queue: RequestQueue, bench: CoordinatorBench) -> dict[str, Any]:
    """Put `num_requests`, then time `num_claims` claims and their acks, twice: with at most
    `num_workers` leases out at a time (a pool of workers, each holding one), and with every
    claimed request still leased (a stress case: the leases a backend must search grow to `num_claims`)."""
    requests = [
        {
            "request_id": f"r{i:07d}",
            "iteration": 0,
            "kind": "rollout",
            "payload": {"prompt": "two red circles", "seed": i, "weights_version": 0},
        }
        for i in range(bench.num_requests)
    ]
    started = time.perf_counter()
    for at in range(0, len(requests), 5000):
        queue.put(requests[at : at + 5000])
    put_s = time.perf_counter() - started
    claim_s = ack_s = 0.0
    num_cycled = max(1, bench.num_claims // bench.num_workers) * bench.num_workers
    for _ in range(num_cycled // bench.num_workers):
        started = time.perf_counter()
        leases = [queue.claim(f"w{w}", lease_s=600) for w in range(bench.num_workers)]
        claim_s += time.perf_counter() - started
        started = time.perf_counter()
        for lease in leases:
            queue.ack(lease, f"results/{lease.request_id}")
        ack_s += time.perf_counter() - started
    started = time.perf_counter()
    held = [queue.claim("w0", lease_s=600) for _ in range(bench.num_claims)]
    held_s = time.perf_counter() - started
    assert all(lease is not None for lease in held)
    return {
        "requests_in_queue": bench.num_requests,
        "puts_per_s": round(bench.num_requests / put_s),
        "claims_per_s": round(num_cycled / claim_s),
        "acks_per_s": round(num_cycled / ack_s),
        "leases_out": bench.num_workers,
        "claims_timed": num_cycled,
        "claims_per_s_all_held": round(bench.num_claims / held_s),
    }


def bench_ledger(path: Path, bench: CoordinatorBench) -> dict[str, Any]:
    """Attempt rows/s recorded one call at a time, inside a phase (batched) and outside (a connection each)."""
    with Ledger(path) as ledger:
        ledger.start_iteration(0)
        started = time.perf_counter()
        with ledger.phase(0, "rollout"):
            for i in range(bench.num_ledger_rows):
                ledger.record_attempt(_attempt(f"b{i}"))
        batched_s = time.perf_counter() - started
        started = time.perf_counter()
        for i in range(bench.num_unbatched_rows):
            ledger.record_attempt(_attempt(f"u{i}"))
        unbatched_s = time.perf_counter() - started
        written = ledger.query("SELECT count(*) FROM attempts").rows[0][0]
    assert written == bench.num_ledger_rows + bench.num_unbatched_rows
    return {
        "rows_per_s_batched": round(bench.num_ledger_rows / batched_s),
        "rows_per_s_unbatched": round(bench.num_unbatched_rows / unbatched_s, 1),
        "rows_batched": bench.num_ledger_rows,
        "rows_unbatched": bench.num_unbatched_rows,
    }


def _attempt(request_id: str) -> AttemptRecord:
    now = time.time()
    return AttemptRecord(request_id, 1, "w0.0", started_at=now, ended_at=now, outcome="done", steps_done=10)


class _Clock:
    """Seconds spent inside the coordinator's own calls."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self, work: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return work()
        finally:
            self.seconds += time.perf_counter() - started


def simulate_iteration(folder: Path, bench: CoordinatorBench) -> dict[str, Any]:
    """The coordinator's real work for one iteration of `num_workers` simulated workers (see the module doc)."""
    folder.mkdir(parents=True, exist_ok=True)
    num = bench.num_workers * bench.requests_per_worker
    rollout_s = bench.requests_per_worker * bench.num_steps * bench.step_s
    train_s, validate_s = rollout_s, bench.num_steps * bench.step_s
    clock = _Clock()
    with open_queue(folder / "queue.db") as queue, Ledger(folder / "ledger.duckdb") as ledger:
        tracker = WorkTracker(ledger)
        clock(lambda: _begin(ledger, tracker, bench.num_workers))
        clock(lambda: ledger.record_phase(0, "rollout", time.time()))
        ids = [f"r{i:05d}" for i in range(num)]
        clock(
            lambda: queue.put(
                [
                    {
                        "request_id": rid,
                        "iteration": 0,
                        "kind": "rollout",
                        "payload": {"prompt": "two red circles", "seed": i},
                    }
                    for i, rid in enumerate(ids)
                ]
            )
        )
        events = _worker_events(queue, bench)  # the workers' side: not coordinator time
        num_polls = round(rollout_s / bench.poll_s)
        per_poll = max(1, len(events) // num_polls)
        for poll in range(num_polls):
            for event in events[poll * per_poll : (poll + 1) * per_poll]:
                clock(lambda event=event: tracker.on_event(event))
            clock(lambda: (queue.states(ids), queue.stats()))
        for event in events[num_polls * per_poll :]:
            clock(lambda event=event: tracker.on_event(event))
        clock(lambda: _finish(ledger, queue, ids, bench))
        rows = clock(lambda: ledger.query("SELECT count(*) FROM attempts").rows[0][0])
    assert rows == num
    worker_s = rollout_s + train_s + validate_s
    return {
        "workers": bench.num_workers,
        "requests": num,
        "worker_events": len(events),
        "queue_polls": num_polls,
        "simulated_worker_s": worker_s,
        "coordinator_s": round(clock.seconds, 3),
        "coordinator_share": round(clock.seconds / (worker_s + clock.seconds), 5),
    }


def _begin(ledger: Ledger, tracker: WorkTracker, num_workers: int) -> None:
    ledger.start_run("bench", preset="bench-coordinator")
    ledger.start_iteration(0, weights_version=0)
    ledger.start_worker("reserved-0", role="trainer", instance_type="reserved-node", spot=False, usd_per_hour=4.0)
    now = time.time()
    ledger.record_phase(0, "sync", now)
    for w in range(num_workers):
        tracker.worker_started(
            f"w{w}.0", role="rollout", instance_type="g6.xlarge", spot=True, usd_per_hour=0.8, gpu_type="L4", at=now
        )
    ledger.record_phase(0, "sync", now, time.time())
    ledger.record_sync(SyncRecord(0, "patch", 40_000_000_000, 400_000_000, iteration=0, encode_s=1.0, apply_s=1.0))


def _worker_events(queue: RequestQueue, bench: CoordinatorBench) -> list[dict[str, Any]]:
    """Claim and ack every request as the workers would, and the event lines they would print."""
    events: list[dict[str, Any]] = []
    t = time.time()
    worker = 0
    while (lease := queue.claim(f"w{worker}", lease_s=600)) is not None:
        wid = f"w{worker}.0"
        events.append(
            {
                "event": "claim",
                "worker_id": wid,
                "t": t,
                "request_id": lease.request_id,
                "attempt": lease.attempts,
                "resumed_from_step": 0,
            }
        )
        for step in range(1, bench.num_steps + 1):
            events.append({"event": "step", "worker_id": wid, "t": t, "step": step, "step_s": bench.step_s})
            if step % bench.commit_every == 0:
                events.append({"event": "commit", "worker_id": wid, "t": t, "step": step})
        queue.ack(lease, f"results/{lease.request_id}")
        events.append({"event": "done", "worker_id": wid, "t": t, "request_id": lease.request_id})
        worker = (worker + 1) % bench.num_workers
    return events


def _finish(ledger: Ledger, queue: RequestQueue, ids: list[str], bench: CoordinatorBench) -> None:
    results = queue.results(ids)
    ledger.record_phase(0, "rollout", time.time() - 1, time.time())
    ledger.record_requests(
        [
            RequestRecord(rid, 0, "rollout", "two red circles", i, 0, "w0.0", 1, result_hash=key, reward=0.5)
            for i, (rid, key) in enumerate(sorted(results.items()))
        ]
    )
    with ledger.phase(0, "train"):
        ledger.record_train_steps([TrainStepRecord(0, s, loss=0.1, reward_mean=0.5) for s in range(bench.num_steps)])
    with ledger.phase(0, "validate"):
        ledger.record_validation(0, weights_version=0, score=0.5, num_prompts=16)
    for phase in ("sync", "rollout", "train", "validate"):
        ledger.query("SELECT wall_s, usd FROM cost_per_phase WHERE iteration = 0 AND phase = ?", [phase])
    ledger.end_iteration(0)


def _bench_redis(folder: Path, bench: CoordinatorBench) -> dict[str, Any]:
    binary = shutil.which("redis-server")
    if binary is None:
        return {"skipped": "redis-server is not on PATH"}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        queue = _open_when_up(f"redis://127.0.0.1:{port}/0")
        with queue:
            return bench_claims(queue, bench)
    finally:
        server.terminate()
        server.wait(timeout=10)


def _open_when_up(url: str) -> RequestQueue:
    from resources.queue.base import QueueUnavailableError

    deadline = time.monotonic() + 10
    while True:
        try:
            return open_queue(url)
        except QueueUnavailableError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _machine() -> dict[str, Any]:
    import os

    return {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()}


def format_coordinator_report(figures: dict[str, Any]) -> str:
    """The figures as a few lines of text."""
    lines = []
    for backend in ("queue_sqlite", "queue_redis"):
        q = figures.get(backend)
        if q is None:
            continue
        if "skipped" in q:
            lines.append(f"{backend}: skipped ({q['skipped']})")
            continue
        lines.append(
            f"{backend}: {q['claims_per_s']} claims/s with {q['requests_in_queue']} requests queued and "
            f"{q['leases_out']} leased (puts {q['puts_per_s']}/s, acks {q['acks_per_s']}/s; "
            f"{q['claims_per_s_all_held']} claims/s while every claim stays leased)"
        )
    led, it = figures["ledger"], figures["iteration"]
    lines.append(
        f"ledger: {led['rows_per_s_batched']} rows/s batched, {led['rows_per_s_unbatched']} rows/s one connection each"
    )
    lines.append(
        f"iteration: {it['workers']} workers, {it['requests']} requests, {it['worker_events']} events: coordinator "
        f"{it['coordinator_s']} s of {it['simulated_worker_s'] + it['coordinator_s']:.0f} s "
        f"= {100 * it['coordinator_share']:.2f} %"
    )
    return "\n".join(lines)
