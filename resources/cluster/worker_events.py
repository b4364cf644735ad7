"""Remote rollout workers' events through the Redis queue: relayed from each worker's stdout, read into the ledger.

A local cluster reads its workers' JSON event lines from their pipes; a spot worker on
another machine prints them to SkyPilot's log, which the coordinator cannot read. So the
spot task pipes the worker through the relay, which echoes every line (the job log keeps
them) and appends the events to the queue's event stream:

    python -m workers.rollout --queue "$SPOTLIGHT_QUEUE" ... |
        python -m resources.cluster.worker_events --queue "$SPOTLIGHT_QUEUE"

The coordinator (`RemoteWorkers`, started by `spotlight run` on a Redis queue) reads the
stream and keeps the ledger as the local cluster does: a `workers` row from each `ready`
event (an SP node's with its `num_gpus`), `attempts` from claims and ends, and a `preemption`
when a spot worker stops on a SIGTERM or a cloud notice (`exit` with reason `stopped`) or vanishes without an `exit`
(SIGKILL: the relay saw its output end). A whole VM taken away takes the relay with it:
that worker's row stays open until the run ends (its lease expiry still frees its request).

Example:
    with RemoteWorkers(queue, ledger):       # in the coordinator, for the whole run
        ...                                  # spot workers anywhere append events meanwhile
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from typing import IO, Any, Iterable

from resources.cluster.ledger import WorkTracker
from resources.ledger import Ledger
from resources.queue import open_queue
from resources.queue.base import QueueError

log = logging.getLogger("spotlight.worker_events")
VANISHED = "vanished"
"""Event the relay appends when a worker's output ends without an `exit` event (it was killed)."""


def relay(lines: Iterable[str], queue: Any, out: IO[str]) -> int:
    """Echo each line to `out`; append each JSON event to `queue` (None: echo only). Returns events relayed."""
    last: dict | None = None
    relayed = 0
    for line in lines:
        out.write(line)
        out.flush()
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue  # not an event (a library printing to stdout)
        if not isinstance(event, dict) or "worker_id" not in event or "event" not in event:
            continue
        last = event
        relayed += _append(queue, [event])
    if last is not None and last["event"] != "exit":
        relayed += _append(queue, [{"t": time.time(), "worker_id": last["worker_id"], "event": VANISHED}])
    return relayed


def _append(queue: Any, events: list[dict]) -> int:
    if queue is None:
        return 0

    try:
        queue.append_events(events)
    except QueueError as err:  # the worker's log still has the line; only the ledger misses it
        log.warning("worker events not relayed: %s", err)
        return 0
    return len(events)


class RemoteWorkers:
    """Reads the queue's event stream in a thread and writes remote workers' rows to the ledger."""

    def __init__(self, queue: Any, ledger: Ledger | None, poll_s: float = 0.5) -> None:
        self.queue, self.ledger, self.poll_s = queue, ledger, poll_s
        self.tracker = WorkTracker(ledger)
        self.live: dict[str, dict] = {}
        """worker_id -> its `ready` event (plus `notice_t` once it reported a notice), while alive."""
        # From the stream's start: spot workers may report ready before the run begins. One queue (Redis
        # database) per run; a resumed run replays the stream and writes the same rows again.
        self._after = "0"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "RemoteWorkers":
        self._thread = threading.Thread(target=self._loop, name="remote-worker-events", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

        try:
            self.pump(block_s=0.001)  # what arrived since the last read
        except QueueError as err:
            log.warning("last remote worker events not read: %s", err)
        for worker_id in list(self.live):  # alive past the run's end: the run stops paying for them here
            self.tracker.worker_ended(worker_id, "scaled_down", time.time())
            del self.live[worker_id]

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.pump(self.poll_s)
            except QueueError as err:
                log.warning("reading remote worker events: %s", err)
                self._stop.wait(self.poll_s)

    def pump(self, block_s: float) -> int:
        """Read and record the events appended since the last read; returns how many."""
        self._after, events = self.queue.read_events(self._after, block_s=block_s)
        for event in events:
            self.on_event(event)
        return len(events)

    def on_event(self, event: dict) -> None:
        worker_id, kind, t = event["worker_id"], event["event"], float(event["t"])
        if kind == "ready":
            self.live[worker_id] = event
            # An SP node reports the GPUs its device workers hold (0 on CPUs: counted as a rollout worker is).
            self.tracker.worker_started(
                worker_id,
                role="rollout",
                instance_type=event.get("instance_type") or "remote",
                spot=bool(event.get("spot", True)),
                usd_per_hour=_price(event),
                gpu_type=event.get("gpu_type"),
                at=t,
                num_gpus=event.get("num_gpus") or None,
            )
        if worker_id not in self.live:
            return  # started before this run (or its `ready` was trimmed): not this run's to record
        if kind == "notice":
            self.live[worker_id].setdefault("notice_t", t)
        elif kind in ("exit", VANISHED):
            self._ended(worker_id, event, t)
            return
        self.tracker.on_event(event)

    def _ended(self, worker_id: str, event: dict, t: float) -> None:
        ready = self.live.pop(worker_id)
        stopped = event["event"] == VANISHED or event.get("reason") == "stopped"
        if stopped and ready.get("spot", True):
            # A SIGTERM or a notice gave the worker time to commit: the notice lasted until it exited (> 0).
            # Vanished: killed without notice (0), whatever it had not committed is lost.
            signalled_at = ready.get("notice_t") or self.tracker.preempted_t(worker_id) or t
            notice_s = 0.0 if event["event"] == VANISHED else max(t - signalled_at, 1e-3)
            self.tracker.preemption(worker_id, min(signalled_at, t), notice_s=notice_s, ended_at=t)
            self.tracker.worker_ended(worker_id, "preempted", t)
        else:
            self.tracker.worker_ended(worker_id, "finished" if not stopped else "scaled_down", t)


def _price(ready: dict) -> float | None:
    """The worker's own $/hour; else None (priced from the table by its GPU), else 0 with a warning."""
    if ready.get("usd_per_hour") is not None:
        return float(ready["usd_per_hour"])
    if ready.get("gpu_type"):
        return None
    log.warning("worker %s reported neither --usd-per-hour nor --gpu-type: costed at $0", ready["worker_id"])
    return 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m resources.cluster.worker_events", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--queue",
        required=True,
        help="The Redis queue URL the worker pulls from (password from "
        "SPOTLIGHT_REDIS_PASSWORD or SPOTLIGHT_REDIS_PASSWORD_FILE).",
    )
    args = parser.parse_args(argv)
    # A preemption's SIGTERM reaches the whole job; the worker handles it, the relay keeps reading until
    # the worker's output ends, so its last events (preempted, exit) still reach the ledger.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    queue = None
    try:
        queue = open_queue(args.queue)
        if not hasattr(queue, "append_events"):
            print(
                "resources.cluster.worker_events: only a Redis queue carries worker events; echoing only",
                file=sys.stderr,
            )
            queue = None
    except (ValueError, QueueError) as err:
        print(f"resources.cluster.worker_events: cannot use the queue, echoing only: {err}", file=sys.stderr)
    relay(sys.stdin, queue, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
