"""The request queue interface: pull-based work with leases, priorities, dead letters and cancel-by-iteration.

Workers pull: `claim` hands out the oldest request of the highest-priority kind (rollout,
then validate, then explore) under a lease. The worker renews the lease with `heartbeat`
while it works and completes the request with `ack`. A lease that is not renewed expires
(a killed spot worker), and the request becomes claimable again with `attempts` + 1; after
`max_deliveries` deliveries it is moved to the dead letters instead. Delivery is
at-least-once; completion is recorded exactly once per request id (the first `ack` wins,
later ones return False), matching results committed exclusively under the request id.

Backends: `SqliteQueue` (one machine, many processes) and `RedisQueue` (Redis Streams
consumer groups, many machines); `open_queue` in resources/queue/__init__.py picks one by URL (this
module imports neither backend: they import it). See docs/QUEUE.md.

Example:
    from resources.queue import open_queue
    queue = open_queue("runs/demo/queue.db")                 # or "redis://:pw@host:6379/0"
    queue.put([{"request_id": "r0", "iteration": 3, "kind": "rollout", "payload": {"seed": 7}}])
    lease = queue.claim("worker-1", lease_s=60)               # in each worker
    ...; queue.heartbeat(lease); ...; queue.ack(lease, rollout_key("demo", 3, "r0"))
    outcome = queue.wait_until_done(["r0"], timeout_s=600)    # in the coordinator
"""

from __future__ import annotations

import abc
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import urlparse

from resources.queue.records import (
    DeadLetter,
    Lease,
    QueueStats,
    Request,
    WaitOutcome,
    finite_positive,
)
from resources.urls import PASSWORD_ENV, REDIS_SCHEMES, RedisAddress, is_plain_path, redis_address  # noqa: F401 (re-exported)

SUPPORTED_URLS = "a file path, sqlite:///absolute/path.db, redis://host:port/db or rediss://host:port/db (TLS)"
END_STATES = ("done", "dead", "cancelled")
log = logging.getLogger("spotlight.queue")


class QueueError(Exception):
    """A queue operation failed in a way the caller cannot fix by changing arguments."""


class QueueUnavailableError(QueueError):
    """The queue cannot be reached, or refused our credentials."""


class QueueStalledError(QueueError):
    """`wait_until_done` saw no worker hold or finish any request of the queue for `stall_s`."""


@dataclass(frozen=True)
class QueueConfig:
    """Policy shared by every process that opens the same queue."""

    max_deliveries: int = 5
    """Deliveries before a request whose leases keep expiring goes to the dead letters.
    Preemptions count as deliveries, so keep this above the preemptions one request may see."""
    connect_timeout_s: float = 3.0
    """How long to wait for the queue (the Redis server, or the SQLite file lock) before failing."""
    reconnect_s: float = 30.0
    """How long an operation on a Redis queue that was reachable keeps retrying a lost connection (a server
    restart, a network blip) with capped exponential backoff, before QueueUnavailableError names the address.
    Keep it above the server's restart time (loading its AOF) and below the lease length."""
    max_lease_s: float = 24 * 3600.0
    """Longest lease a claim or heartbeat may ask for."""
    stall_s: float = 600.0
    """`wait_until_done` raises QueueStalledError after this long with no live lease anywhere in the queue and
    no request finished: no worker pulls from it. Long requests never trip it (their leases stay live); keep it
    above the time a lost worker's replacement takes to start (a spot relaunch) plus one lease."""
    stall_warn_s: float = 60.0
    """`wait_until_done` logs one warning after this long without claim activity (and one when it resumes)."""

    def __post_init__(self) -> None:
        if isinstance(self.max_deliveries, bool) or not isinstance(self.max_deliveries, int) or self.max_deliveries < 1:
            raise ValueError(f"QueueConfig.max_deliveries must be an int >= 1, got {self.max_deliveries!r}")
        finite_positive(self.connect_timeout_s, "QueueConfig.connect_timeout_s")
        finite_positive(self.reconnect_s, "QueueConfig.reconnect_s")
        finite_positive(self.max_lease_s, "QueueConfig.max_lease_s")
        finite_positive(self.stall_s, "QueueConfig.stall_s")
        finite_positive(self.stall_warn_s, "QueueConfig.stall_warn_s")


class RequestQueue(abc.ABC):
    """Leased, prioritised, at-least-once work queue with an exactly-once completion record."""

    config: QueueConfig

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """URL that `open_queue` turns back into the same queue (never holds a password)."""

    @abc.abstractmethod
    def put(self, requests: Iterable[Request | Mapping[str, Any]]) -> int:
        """Enqueue requests; ids already known to the queue (in any state) are skipped. Returns how many were added."""

    @abc.abstractmethod
    def claim(self, worker_id: str, lease_s: float) -> Lease | None:
        """Lease the next request (highest priority, then oldest), or None when nothing is claimable."""

    @abc.abstractmethod
    def heartbeat(self, lease: Lease) -> bool:
        """Extend the lease to `lease.lease_s` from now. False when the lease is lost (reclaimed by
        another worker, dead-lettered, cancelled or done): the worker should stop working on it."""

    @abc.abstractmethod
    def release(self, lease: Lease) -> bool:
        """Give the request back at once (e.g. on a preemption notice, after committing state).
        The delivery still counts toward max_deliveries. False when the lease was already lost."""

    @abc.abstractmethod
    def ack(self, lease: Lease | str, result_key: str) -> bool:
        """Record the request (a lease or a request id) as done with its result key. True if this
        call completed it; False if it was already done or cancelled (a duplicate is harmless)."""

    @abc.abstractmethod
    def purge_finished(self, before_iteration: int) -> int:
        """Forget the done requests of iterations < `before_iteration`; returns how many. Their ids become
        unknown (`states` says 'unknown', `results` omits them, a re-put queues them afresh), so call it only
        for iterations whose results are consumed and whose requests nobody puts again."""

    @abc.abstractmethod
    def cancel_iteration(self, iteration: int, kind: str | None = None) -> int:
        """Drop pending and leased requests of an iteration (optionally one kind). Returns how many."""

    @abc.abstractmethod
    def stats(self) -> QueueStats:
        """Counts by state across the whole queue."""

    @abc.abstractmethod
    def states(self, request_ids: Iterable[str]) -> dict[str, str]:
        """request id -> one of REQUEST_STATES ('unknown' for ids never put)."""

    @abc.abstractmethod
    def results(self, request_ids: Iterable[str]) -> dict[str, str]:
        """request id -> result key, for those of `request_ids` that are done."""

    @abc.abstractmethod
    def dead_letters(self) -> list[DeadLetter]:
        """Requests given up after max_deliveries, oldest first."""

    def close(self) -> None:  # noqa: B027 - an optional hook: a queue with nothing to release keeps this no-op
        """Release connections; the queue object is unusable afterwards. Does nothing unless a subclass overrides it."""

    def __enter__(self) -> "RequestQueue":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_until_done(
        self, request_ids: Iterable[str], timeout_s: float, poll_s: float = 0.2, stall_s: float | None = None
    ) -> WaitOutcome:
        """Poll until every request is done, dead or cancelled, or `timeout_s` passes.

        Never raises on timeout: check `outcome.complete` and `outcome.unfinished`. Raises
        QueueStalledError when for `stall_s` (default `config.stall_s`) no worker held a lease
        on any request of the queue and none of `request_ids` finished: nobody pulls from it.
        """
        ids = list(dict.fromkeys(request_ids))
        finite_positive(poll_s, "poll_s")
        watch = _ClaimWatch(
            self,
            self.config.stall_s if stall_s is None else finite_positive(stall_s, "stall_s"),
            warn_s=self.config.stall_warn_s,
        )
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            states = self.states(ids)
            if all(s in END_STATES for s in states.values()) or time.monotonic() >= deadline:
                break
            watch.check(states)
            time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))
        done = [r for r, s in states.items() if s == "done"]
        return WaitOutcome(results=self.results(done), states=states)


class _ClaimWatch:
    """How long since a worker last held a lease in the queue or finished a waited-for request.

    Presence of a live lease is the sign of a worker: a busy one renews its lease, and both
    backends report a lease that ran out (a killed worker) as pending again.
    """

    def __init__(self, queue: RequestQueue, stall_s: float, warn_s: float) -> None:
        self.queue, self.stall_s, self.warn_s = queue, stall_s, min(warn_s, stall_s)
        self.quiet_since = time.monotonic()
        self.finished = 0
        self.warned = False

    def check(self, states: Mapping[str, str]) -> None:
        """Call once per poll with the waited-for requests' states; raises QueueStalledError on a stall."""
        finished = sum(s in END_STATES for s in states.values())
        now = time.monotonic()
        if finished > self.finished or "leased" in states.values() or self.queue.stats().leased > 0:
            if self.warned:
                log.warning("queue %s: workers are claiming requests again", self.queue.url)
            self.finished, self.quiet_since, self.warned = finished, now, False
            return
        quiet_s, waiting = now - self.quiet_since, len(states) - finished
        if quiet_s >= self.stall_s:
            raise QueueStalledError(
                f"no worker claimed any request from {self.queue.url} in {self.stall_s:g} seconds ({waiting} of "
                f"{len(states)} requests still waiting). Check that rollout workers are running and alive (their "
                "logs, e.g. the run's worker_logs/) and that they pull from this same queue: the same redis:// URL, "
                "or the same SQLite file by absolute path (a relative path names another file in another directory)"
            )
        if quiet_s >= self.warn_s and not self.warned:
            self.warned = True
            log.warning(
                "queue %s: no worker has claimed any request for %.3g s (%d waiting); failing after %g s "
                "without claims",
                self.queue.url,
                quiet_s,
                waiting,
                self.stall_s,
            )


def parse_queue_url(url: str | Path) -> Path | RedisAddress:
    """Check a queue URL without connecting: a SQLite file Path, or a RedisAddress."""
    text = str(url)
    if not text:
        raise ValueError(f"queue URL is empty: use {SUPPORTED_URLS}")
    parsed = urlparse(text)
    scheme = parsed.scheme.lower()
    if is_plain_path(text, scheme):  # a plain (or Windows) path
        return Path(text)
    if scheme == "sqlite":
        if parsed.netloc or not parsed.path.startswith("/") or parsed.query:
            raise ValueError(f"queue URL {text!r}: a SQLite URL must look like sqlite:///absolute/path.db")
        return Path(parsed.path)
    if scheme in REDIS_SCHEMES:
        return redis_address(text)
    raise ValueError(f"unsupported queue URL scheme {scheme!r}: use {SUPPORTED_URLS}")
