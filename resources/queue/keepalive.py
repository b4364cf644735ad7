"""Keep a queue lease alive from a background thread while the worker's main thread computes.

Example:
    lease = queue.claim(worker_id, lease_s=60)
    with LeaseKeeper(queue, lease) as keeper:
        for step in range(num_steps):
            if keeper.lost:          # reclaimed, cancelled or done elsewhere: stop wasting work
                break
            ...
"""

from __future__ import annotations

import threading

from resources.queue.base import QueueUnavailableError, RequestQueue
from resources.queue.records import Lease


class LeaseKeeper:
    """Heartbeats `lease` every `interval_s` (default: a third of the lease, so two beats may
    fail before it expires) until the context exits; `lost` turns True when the queue says the
    lease is gone. An unreachable queue is not a lost lease: the keeper keeps trying."""

    def __init__(self, queue: RequestQueue, lease: Lease, interval_s: float | None = None) -> None:
        self.queue = queue
        self.lease = lease
        self.interval_s = lease.lease_s / 3 if interval_s is None else interval_s
        if not 0 < self.interval_s < lease.lease_s:
            raise ValueError(f"interval_s must be in (0, lease_s={lease.lease_s:g}), got {self.interval_s!r}")
        self._lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"lease-{lease.request_id}", daemon=True)

    @property
    def lost(self) -> bool:
        """True once a heartbeat was refused: another worker owns the request, or it is finished."""
        return self._lost.is_set()

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                alive = self.queue.heartbeat(self.lease)
            except QueueUnavailableError:
                continue  # a blip: the lease may still be ours when the queue is back
            if not alive:
                self._lost.set()
                return
