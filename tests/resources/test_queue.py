"""The request-queue contract, run against SQLite and a real redis-server (tests/conftest.py starts it).

URLs, credentials and connection errors: tests/resources/test_queue_urls.py.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from typing import Iterator

import pytest

from resources.queue import open_queue
from resources.queue.base import PASSWORD_ENV, QueueConfig, RequestQueue
from resources.queue.keepalive import LeaseKeeper
from resources.queue.records import Request
from tests.paths import REPO_ROOT
from tests.procs import ProcessLines

REPO = REPO_ROOT
SHORT_LEASE_S = 1.0
"""A lease meant to expire: longer than any stall of a loaded machine between a claim and the next call
(those checks say "still leased"); the waits for its expiry poll the queue, so they last about the lease."""


def _wait_until_expired(queue: RequestQueue, leased: int = 0, timeout_s: float = 30.0) -> None:
    """Poll until no more than `leased` leases are live (expired ones count as pending)."""
    deadline = time.monotonic() + timeout_s
    while queue.stats().leased > leased:
        assert time.monotonic() < deadline, f"a lease of {SHORT_LEASE_S} s did not expire within {timeout_s} s"
        time.sleep(0.05)


# --- fixtures ------------------------------------------------------------------------------


def _open(request: pytest.FixtureRequest, config: QueueConfig) -> RequestQueue:
    if request.param == "sqlite":
        return open_queue(request.getfixturevalue("tmp_path") / "queue.db", config)
    server = request.getfixturevalue("redis_server")
    server.flush()
    # The password from the environment, so `open_queue(queue.url)` works here and in subprocesses.
    request.getfixturevalue("monkeypatch").setenv(PASSWORD_ENV, server.password)
    return open_queue(server.url(), config)


@pytest.fixture(params=["sqlite", "redis"])
def queue(request: pytest.FixtureRequest) -> Iterator[RequestQueue]:
    with _open(request, QueueConfig()) as opened:
        yield opened


@pytest.fixture(params=["sqlite", "redis"])
def twice_queue(request: pytest.FixtureRequest) -> Iterator[RequestQueue]:
    """A queue that dead-letters a request after two deliveries."""
    with _open(request, QueueConfig(max_deliveries=2)) as opened:
        yield opened


def rollout(rid: str, iteration: int = 0, kind: str = "rollout", **payload: object) -> dict:
    return {"request_id": rid, "iteration": iteration, "kind": kind, "payload": payload}


def drain(queue: RequestQueue, worker_id: str = "w") -> list[str]:
    """Claim and ack everything claimable, in claim order."""
    order = []
    while (lease := queue.claim(worker_id, lease_s=30)) is not None:
        order.append(lease.request_id)
        queue.ack(lease, f"results/{lease.request_id}")
    return order


# --- the contract ------------------------------------------------------------------------


def test_claim_on_an_empty_queue_returns_none(queue: RequestQueue) -> None:
    assert queue.claim("w1", lease_s=10) is None


def test_a_claimed_request_carries_its_payload_and_first_attempt(queue: RequestQueue) -> None:
    queue.put([rollout("r0", iteration=3, prompt="a red cube", seed=7)])
    lease = queue.claim("w1", lease_s=10)
    assert lease is not None
    assert lease.request == Request("r0", 3, "rollout", {"prompt": "a red cube", "seed": 7})
    assert (lease.worker_id, lease.attempts) == ("w1", 1)
    assert queue.claim("w2", lease_s=10) is None  # leased: nobody else gets it


def test_put_skips_request_ids_the_queue_already_knows(queue: RequestQueue) -> None:
    assert queue.put([rollout("r0"), rollout("r1")]) == 2
    assert queue.put([rollout("r1"), rollout("r2")]) == 1
    drain(queue)
    assert queue.put([rollout("r0")]) == 0  # even once done: a re-sent batch does not redo work
    assert queue.stats().done == 3


def test_rollouts_come_before_validations_before_explorations_and_fifo_within_a_kind(queue: RequestQueue) -> None:
    kinds = ["explore", "validate", "rollout", "explore", "rollout", "validate"]
    queue.put([rollout(f"r{i}", kind=kind) for i, kind in enumerate(kinds)])
    assert drain(queue) == ["r2", "r4", "r1", "r5", "r0", "r3"]


def test_ack_completes_once_and_a_duplicate_ack_is_harmless(queue: RequestQueue) -> None:
    queue.put([rollout("r0"), rollout("r1")])
    lease = queue.claim("w1", lease_s=10)
    assert queue.ack(lease, "results/r0-first") is True
    assert queue.ack(lease, "results/r0-second") is False
    assert queue.ack("r1", "results/r1") is True  # by request id, e.g. from a coordinator
    assert queue.results(["r0", "r1", "nope"]) == {"r0": "results/r0-first", "r1": "results/r1"}
    assert queue.heartbeat(lease) is False  # done: the worker learns it can stop


def test_an_expired_lease_is_reclaimed_by_another_worker_with_one_more_attempt(queue: RequestQueue) -> None:
    queue.put([rollout("r0")])
    first = queue.claim("w1", lease_s=SHORT_LEASE_S)
    assert queue.claim("w2", lease_s=10) is None
    _wait_until_expired(queue)
    assert queue.stats().pending == 1
    second = queue.claim("w2", lease_s=10)
    assert (second.request_id, second.worker_id, second.attempts) == ("r0", "w2", 2)
    assert queue.heartbeat(first) is False  # the slow worker has lost it
    assert queue.heartbeat(second) is True
    # The slow worker finishes anyway: its result is recorded once, the second is a duplicate.
    assert queue.ack(first, "results/r0") is True
    assert queue.ack(second, "results/r0") is False
    assert queue.stats() == type(queue.stats())(pending=0, leased=0, done=1, dead=0, cancelled=0)


def test_the_same_worker_reclaiming_its_expired_lease_cannot_renew_the_old_one(queue: RequestQueue) -> None:
    queue.put([rollout("r0")])
    old = queue.claim("w1", lease_s=SHORT_LEASE_S)
    _wait_until_expired(queue)
    new = queue.claim("w1", lease_s=10)
    assert new.attempts == 2
    assert queue.heartbeat(old) is False
    assert queue.heartbeat(new) is True


def test_heartbeats_keep_a_lease_beyond_its_length(queue: RequestQueue) -> None:
    queue.put([rollout("r0")])
    lease = queue.claim("w1", lease_s=SHORT_LEASE_S)
    ends = time.monotonic() + 1.5 * SHORT_LEASE_S
    while time.monotonic() < ends:  # beats often, so a stalled beat still lands inside the lease
        assert queue.heartbeat(lease) is True
        time.sleep(0.1)
    assert queue.heartbeat(lease) is True
    assert queue.claim("w2", lease_s=10) is None
    assert queue.stats().leased == 1


def test_a_lease_keeper_holds_the_lease_and_reports_when_it_is_lost(queue: RequestQueue) -> None:
    queue.put([rollout("r0", iteration=1)])
    beyond = time.monotonic() + 1.5 * SHORT_LEASE_S
    lease = queue.claim("w1", lease_s=SHORT_LEASE_S)
    beats = []
    heartbeat = queue.heartbeat

    def counted(held):
        beats.append(heartbeat(held))
        return beats[-1]

    queue.heartbeat = counted  # the real heartbeat, counted
    with LeaseKeeper(queue, lease, interval_s=0.1) as keeper:  # a beat may stall 0.9 s and still land in time
        deadline = time.monotonic() + 30
        while len(beats) < 3 or time.monotonic() < beyond:
            assert time.monotonic() < deadline, f"the keeper beat {len(beats)} times in 30 s"
            time.sleep(0.05)
        assert queue.claim("w2", lease_s=10) is None and not keeper.lost and all(beats)
        queue.cancel_iteration(1)
        deadline = time.monotonic() + 30
        while not keeper.lost:
            assert time.monotonic() < deadline, "the keeper did not notice the cancellation within 30 s"
            time.sleep(0.05)


def test_a_released_request_is_claimable_at_once(queue: RequestQueue) -> None:
    queue.put([rollout("r0")])
    lease = queue.claim("w1", lease_s=60)
    assert queue.release(lease) is True
    again = queue.claim("w2", lease_s=60)
    assert (again.request_id, again.attempts) == ("r0", 2)
    assert queue.release(lease) is False


def test_a_request_goes_to_the_dead_letters_after_max_deliveries(twice_queue: RequestQueue) -> None:
    queue = twice_queue
    queue.put([rollout("poison", iteration=4), rollout("fine")])
    for attempt in (1, 2):
        lease = queue.claim(f"w{attempt}", lease_s=SHORT_LEASE_S)
        assert (lease.request_id, lease.attempts) == ("poison", attempt)
        _wait_until_expired(queue)
    assert queue.claim("w3", lease_s=10).request_id == "fine"  # poison is skipped and buried
    [dead] = queue.dead_letters()
    assert (dead.request.request_id, dead.request.iteration, dead.attempts) == ("poison", 4, 2)
    assert queue.states(["poison"]) == {"poison": "dead"}
    assert queue.stats().dead == 1


def test_a_late_ack_of_a_dead_letter_still_completes_it(twice_queue: RequestQueue) -> None:
    queue = twice_queue
    queue.put([rollout("slow")])
    for _ in range(2):
        lease = queue.claim("w1", lease_s=SHORT_LEASE_S)
        _wait_until_expired(queue)
    assert queue.claim("w2", lease_s=10) is None
    assert queue.ack(lease, "results/slow") is True
    assert queue.dead_letters() == []
    assert queue.states(["slow"]) == {"slow": "done"}


def test_cancel_iteration_drops_its_pending_and_leased_requests_only(queue: RequestQueue) -> None:
    queue.put([rollout("old-a", 1, "explore"), rollout("old-b", 1, "explore"), rollout("old-c", 1, "rollout")])
    queue.put([rollout("new-a", 2, "explore")])
    leased = queue.claim("w1", lease_s=60)  # old-c: rollouts first
    queue.ack(leased, "results/old-c")
    leased = queue.claim("w1", lease_s=60)  # old-a
    assert queue.cancel_iteration(1, kind="explore") == 2
    assert queue.heartbeat(leased) is False
    assert queue.ack(leased, "results/old-a") is False  # a cancelled request stays cancelled
    assert queue.states(["old-a", "old-b", "old-c", "new-a"]) == {
        "old-a": "cancelled",
        "old-b": "cancelled",
        "old-c": "done",
        "new-a": "pending",
    }
    assert drain(queue) == ["new-a"]
    assert queue.stats().cancelled == 2


def test_cancel_iteration_of_one_kind_keeps_other_kinds(queue: RequestQueue) -> None:
    queue.put([rollout("e", 5, "explore"), rollout("v", 5, "validate")])
    assert queue.cancel_iteration(5, kind="explore") == 1
    assert drain(queue) == ["v"]
    with pytest.raises(ValueError, match="kind must be one of"):
        queue.cancel_iteration(5, kind="train")


def test_stats_count_requests_in_every_state(twice_queue: RequestQueue) -> None:
    queue = twice_queue
    queue.put([rollout(f"r{i}", iteration=i % 2) for i in range(6)])
    queue.ack(queue.claim("w", lease_s=60), "results/r0")
    queue.claim("w", lease_s=60)  # r1 leased
    queue.cancel_iteration(0)  # r2, r4
    stats = queue.stats()
    assert (stats.pending, stats.leased, stats.done, stats.dead, stats.cancelled) == (2, 1, 1, 0, 2)
    assert stats.open == 3


def test_wait_until_done_returns_the_results_once_every_request_is_finished(queue: RequestQueue) -> None:
    queue.put([rollout("r0"), rollout("r1")])
    drain(queue)
    outcome = queue.wait_until_done(["r0", "r1"], timeout_s=5)
    assert outcome.complete
    assert outcome.results == {"r0": "results/r0", "r1": "results/r1"}


def test_wait_until_done_times_out_naming_the_unfinished_requests(queue: RequestQueue) -> None:
    queue.put([rollout("r0"), rollout("r1")])
    queue.ack("r0", "results/r0")
    started = time.monotonic()
    outcome = queue.wait_until_done(["r0", "r1", "never-put"], timeout_s=0.3, poll_s=0.05)
    assert time.monotonic() - started < 2
    assert not outcome.complete
    assert outcome.unfinished == ["never-put", "r1"]
    assert outcome.results == {"r0": "results/r0"}


def test_a_reopened_queue_sees_the_same_requests(queue: RequestQueue) -> None:
    queue.put([rollout("r0"), rollout("r1")])
    lease = queue.claim("w1", lease_s=60)
    with open_queue(queue.url) as other:
        assert other.claim("w2", lease_s=60).request_id == "r1"
        assert other.ack(lease, "results/r0") is True
    assert queue.states(["r0", "r1"]) == {"r0": "done", "r1": "leased"}


@pytest.mark.parametrize(
    "bad, message",
    [
        (rollout("has space"), "request id"),
        (rollout("r", iteration=-1), "iteration must be an int >= 0"),
        (rollout("r", kind="train"), "kind must be one of"),
        ({"request_id": "r", "kind": "rollout"}, "missing fields \\['iteration'\\]"),
        (rollout("r", blob=object()), "not JSON-serialisable"),
        (rollout("r", blob="x" * 70_000), "put large data in the tensor store"),
    ],
)
def test_invalid_requests_are_rejected_before_anything_is_queued(queue: RequestQueue, bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        queue.put([rollout("ok"), bad])
    assert queue.stats().pending == 0


@pytest.mark.parametrize("lease_s", [0, -1, float("nan"), 10 * 24 * 3600])
def test_claim_rejects_lease_lengths_out_of_range(queue: RequestQueue, lease_s: float) -> None:
    with pytest.raises(ValueError, match="lease_s must be a number in"):
        queue.claim("w1", lease_s=lease_s)


_WORKER = """
import json, sys, time
from resources.queue import open_queue
queue, claimed = open_queue(sys.argv[1]), []
print("ready", flush=True)
sys.stdin.readline()  # start together, so the workers really compete
while True:
    lease = queue.claim(sys.argv[2], lease_s=60)
    if lease is None:
        if queue.stats().open == 0:
            break
        time.sleep(0.01)
        continue
    claimed.append(lease.request_id)
    time.sleep(0.002)  # the work: lets other workers claim in between
    assert queue.ack(lease, "results/" + lease.request_id)
print(json.dumps(claimed))
"""


def test_concurrent_worker_processes_complete_every_request_exactly_once(queue: RequestQueue) -> None:
    ids = [f"r{i:03d}" for i in range(150)]
    queue.put([rollout(rid, kind=("rollout", "explore")[i % 2]) for i, rid in enumerate(ids)])
    command = [sys.executable, "-c", _WORKER, queue.url]
    with contextlib.ExitStack() as stack:  # no worker outlives the test
        workers = [
            stack.enter_context(
                ProcessLines(
                    subprocess.Popen(
                        [*command, f"w{n}"],
                        cwd=REPO,
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                )
            )
            for n in range(3)
        ]
        for worker in workers:
            worker.expect("ready", timeout_s=60)
        for worker in workers:
            worker.proc.stdin.write("go\n")
            worker.proc.stdin.flush()
        finished = [worker.finish(timeout_s=120) for worker in workers]
    assert all(worker.proc.returncode == 0 for worker in workers), [err for _, err in finished]
    claimed = [json.loads(rest[-1]) for rest, _ in finished]
    everything = [rid for per_worker in claimed for rid in per_worker]
    assert sorted(everything) == ids  # no request twice: leases were long enough never to expire
    assert sum(1 for per_worker in claimed if per_worker) >= 2, "the workers did not run concurrently"
    assert queue.results(ids) == {rid: f"results/{rid}" for rid in ids}
