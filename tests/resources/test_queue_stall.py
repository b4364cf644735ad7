"""The coordinator's wait fails loudly when no worker pulls from its queue, and never while workers are busy."""

from __future__ import annotations

import logging
import re
import threading

import pytest

from resources.queue import open_queue
from resources.queue.base import QueueConfig, QueueStalledError

STALL_S = 0.5


def _requests(n: int) -> list[dict]:
    return [{"request_id": f"r{i}", "iteration": 0, "kind": "rollout"} for i in range(n)]


@pytest.fixture
def queue(tmp_path):
    with open_queue(tmp_path / "queue.db", QueueConfig(stall_warn_s=0.1)) as q:
        yield q


def test_waiting_on_a_queue_no_worker_pulls_from_fails_naming_the_queue(queue, caplog):
    queue.put(_requests(3))
    with caplog.at_level(logging.WARNING, logger="spotlight.queue"):
        with pytest.raises(
            QueueStalledError, match=re.escape(f"no worker claimed any request from {queue.url}")
        ) as err:
            queue.wait_until_done(["r0", "r1", "r2"], timeout_s=120, poll_s=0.02, stall_s=STALL_S)
    assert "3 of 3 requests still waiting" in str(err.value) and "absolute path" in str(err.value)
    warnings = [r.getMessage() for r in caplog.records if "no worker has claimed" in r.getMessage()]
    assert len(warnings) == 1 and queue.url in warnings[0]  # warned once, before failing


def _worker(url: str, num_requests: int, heartbeats_per_request: int, stop: threading.Event) -> None:
    """Claims one request at a time, works on it (renewing the lease) for a few stall bounds, then acks."""
    with open_queue(url) as q:
        done = 0
        while done < num_requests and not stop.is_set():
            lease = q.claim("fake-worker", lease_s=STALL_S)
            if lease is None:
                stop.wait(0.02)
                continue
            for _ in range(heartbeats_per_request):
                stop.wait(STALL_S / 4)
                assert q.heartbeat(lease)
            q.ack(lease, f"results/{lease.request_id}")
            done += 1


def test_a_worker_busy_on_long_requests_is_never_mistaken_for_a_stall(queue):
    # Each request takes 2 stall bounds of work; the second waits pending behind the first all that time.
    queue.put(_requests(2))
    stop = threading.Event()
    worker = threading.Thread(target=_worker, args=(queue.url, 2, 8, stop), daemon=True)
    worker.start()
    try:
        outcome = queue.wait_until_done(["r0", "r1"], timeout_s=120, poll_s=0.02, stall_s=STALL_S)
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive(), "the fake worker did not stop within 60 s"
    assert outcome.complete and outcome.results == {"r0": "results/r0", "r1": "results/r1"}


def test_asking_whether_requests_are_done_never_waits_for_the_stall_bound(queue):
    queue.put(_requests(1))
    outcome = queue.wait_until_done(["r0"], timeout_s=0, stall_s=STALL_S)
    assert not outcome.complete and outcome.unfinished == ["r0"]


@pytest.mark.parametrize("field", ["stall_s", "stall_warn_s"])
def test_a_stall_bound_that_is_not_a_positive_number_is_refused(field):
    with pytest.raises(ValueError, match=f"QueueConfig.{field}"):
        QueueConfig(**{field: 0})
