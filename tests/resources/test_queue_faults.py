"""Queue faults: a Redis restart mid-run (AOF on), Redis gone for good, a worker whose clock is off by a lease.

Each runs against a real redis-server of its own (the shared session one never writes to disk).
The SQLite queue's clock is covered by its single-host assumption (docs/FAULTS.md, "Queue faults").
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from resources.queue import open_queue
from resources.queue.base import PASSWORD_ENV, QueueConfig, QueueUnavailableError
from resources.queue.keepalive import LeaseKeeper
from tests.conftest import RedisServer, _free_port, _wait_for_ping
from tests.paths import REPO_ROOT
from tests.procs import ProcessLines


class PersistentRedis:
    """A redis-server with `appendonly yes` in a folder of its own, which a test may stop and start again."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        self.server = RedisServer(_free_port(), "fault-test-password-Qm4")
        self.args = [
            binary,
            "--port",
            str(self.server.port),
            "--bind",
            "127.0.0.1",
            "--requirepass",
            self.server.password,
            "--save",
            "",
            "--appendonly",
            "yes",
            "--dir",
            str(folder),
        ]
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for_ping(self.server)

    def stop(self) -> None:
        """SIGTERM: the server flushes its AOF and exits, as on a restart."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=20)


@pytest.fixture
def aof_redis(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PersistentRedis]:
    redis = PersistentRedis(tmp_path / "redis")
    (tmp_path / "redis").mkdir()
    redis.start()
    monkeypatch.setenv(PASSWORD_ENV, redis.server.password)
    try:
        yield redis
    finally:
        redis.stop()


def _rollout(rid: str, iteration: int = 0) -> dict:
    return {"request_id": rid, "iteration": iteration, "kind": "rollout", "payload": {"seed": 1}}


def _worker(url: str, name: str, acks: list, errors: list, stop: threading.Event) -> None:
    """Claim, work 20 ms, ack, until told to stop; what it acked (and whether first) goes to `acks`."""
    try:
        with open_queue(url, QueueConfig(reconnect_s=20)) as queue:
            while not stop.is_set():
                lease = queue.claim(name, lease_s=2.0)  # short: a claim whose reply was lost frees itself soon
                if lease is None:
                    time.sleep(0.01)
                    continue
                time.sleep(0.02)
                acks.append((lease.request_id, queue.ack(lease, f"results/{lease.request_id}")))
    except Exception as err:  # the test reports any failure of a worker thread
        errors.append(err)


def test_a_redis_restart_mid_run_loses_no_request_and_completes_none_twice(aof_redis: PersistentRedis) -> None:
    url = aof_redis.server.url()
    ids = [f"r{i:03d}" for i in range(60)]
    acks: list = []
    errors: list = []
    stop = threading.Event()
    with open_queue(url, QueueConfig(reconnect_s=20)) as coordinator:
        coordinator.put([_rollout(rid) for rid in ids])
        workers = [threading.Thread(target=_worker, args=(url, f"w{n}", acks, errors, stop)) for n in range(3)]
        for worker in workers:
            worker.start()
        deadline = time.monotonic() + 60
        while len(acks) < 10:
            assert not errors, errors
            assert time.monotonic() < deadline, f"the workers acked {len(acks)} of 10 requests within 60 s"
            time.sleep(0.01)
        aof_redis.stop()  # mid-run: workers are claiming and acking
        done_before = len(acks)
        restart = threading.Timer(1.0, aof_redis.start)
        restart.start()
        started = time.monotonic()
        stats = coordinator.stats()  # waits through the outage instead of failing
        assert time.monotonic() - started >= 0.9
        restart.join()
        outcome = coordinator.wait_until_done(ids, timeout_s=60)
        stop.set()
        for worker in workers:
            worker.join(timeout=30)
    assert errors == []
    assert done_before < len(ids) and stats.done >= done_before  # the AOF kept what was acked before
    assert outcome.complete and outcome.results == {rid: f"results/{rid}" for rid in ids}  # none lost
    firsts = Counter(rid for rid, first in acks if first)
    assert firsts == Counter(ids)  # each completed exactly once


def test_a_redis_that_stays_down_fails_after_the_reconnect_bound_naming_its_address(aof_redis: PersistentRedis) -> None:
    with open_queue(aof_redis.server.url(), QueueConfig(reconnect_s=1.0)) as queue:
        queue.put([_rollout("r0")])
        aof_redis.stop()
        started = time.monotonic()
        with pytest.raises(QueueUnavailableError) as caught:
            queue.claim("w1", lease_s=10)
        waited_s = time.monotonic() - started
    message = str(caught.value)
    assert f"127.0.0.1:{aof_redis.server.port}/0 stayed unreachable for 1 s during claim" in message
    assert "redis-server is running" in message and aof_redis.server.password not in message
    assert 0.9 <= waited_s < 6


_SKEWED_WORKER = r"""
import json, sys, time
skew_s = float(sys.argv[2])
real_time, real_monotonic = time.time, time.monotonic
time.time = lambda: real_time() + skew_s            # this worker's clocks are off by skew_s
time.monotonic = lambda: real_monotonic() + skew_s
from resources.queue.keepalive import LeaseKeeper
from resources.queue import open_queue
queue = open_queue(sys.argv[1])
lease_s = float(sys.argv[3])
claimed = []
first = queue.claim("skewed", lease_s=lease_s)
claimed.append(first.request_id)
print("holding", flush=True)
with LeaseKeeper(queue, first, interval_s=0.1) as keeper:  # a beat may stall 1.9 s on a loaded machine
    ends = real_monotonic() + 3 * lease_s
    while real_monotonic() < ends:                  # keeps trying to take more work meanwhile
        other = queue.claim("skewed", lease_s=lease_s)
        if other is not None:
            claimed.append(other.request_id)
        time.sleep(0.05)
    lost = keeper.lost
print(json.dumps({"claimed": claimed, "lost": lost, "acked": queue.ack(first, "results/" + first.request_id)}))
"""


@pytest.mark.parametrize("skew", [1.0, -1.0], ids=["ahead", "behind"])
def test_a_worker_whose_clock_is_off_by_a_lease_neither_steals_a_live_lease_nor_loses_its_own(
    aof_redis: PersistentRedis, skew: float
) -> None:
    lease_s = 2.0
    with open_queue(aof_redis.server.url()) as queue:
        queue.put([_rollout("mine"), _rollout("theirs")])
        mine = queue.claim("honest", lease_s=lease_s)
        assert mine.request_id == "mine"
        with LeaseKeeper(queue, mine, interval_s=0.1) as keeper:  # a beat may stall 1.9 s on a loaded machine
            with ProcessLines(
                subprocess.Popen(
                    [sys.executable, "-c", _SKEWED_WORKER, aof_redis.server.url(), str(skew * lease_s), str(lease_s)],
                    cwd=REPO_ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            ) as skewed:
                skewed.expect("holding", timeout_s=60)
                mine_claims = []
                deadline = time.monotonic() + 60
                while skewed.proc.poll() is None:  # the honest worker tries to take the skewed one's request meanwhile
                    assert time.monotonic() < deadline, "the skewed worker did not finish within 60 s"
                    mine_claims.append(queue.claim("honest", lease_s=lease_s))
                    time.sleep(0.05)
                rest, err = skewed.finish(timeout_s=30)
            report = json.loads(rest[-1]) if rest else err
            assert not keeper.lost
        assert queue.ack(mine, "results/mine") is True
    assert skewed.proc.returncode == 0, err
    assert report == {"claimed": ["theirs"], "lost": False, "acked": True}  # never took "mine", kept "theirs"
    assert mine_claims and all(c is None for c in mine_claims)


def test_purging_forgets_only_finished_iterations_on_redis_too(aof_redis: PersistentRedis) -> None:
    with open_queue(aof_redis.server.url()) as queue:
        queue.put([_rollout("a", 0), _rollout("b", 1), _rollout("c", 1), _rollout("d", 0)])
        for rid in ("a", "b"):
            queue.ack(rid, f"results/{rid}")
        assert queue.purge_finished(before_iteration=1) == 1
        assert queue.states(["a", "b", "c", "d"]) == {"a": "unknown", "b": "done", "c": "pending", "d": "pending"}
        assert queue.results(["a", "b"]) == {"b": "results/b"}
        assert queue.stats().done == 1
        assert queue.put([_rollout("a", 0)]) == 1  # forgotten: queued afresh


def _commands_run(url_port: int, password: str) -> int:
    import redis

    with redis.Redis(port=url_port, password=password) as client:
        stats = client.info("commandstats")
    ours = ("cmdstat_info", "cmdstat_auth", "cmdstat_hello", "cmdstat_client")  # this helper's own connection
    return sum(v["calls"] for k, v in stats.items() if not k.startswith(ours))


def test_a_redis_claim_costs_the_same_whatever_the_queue_holds_and_however_many_leases_are_out(
    aof_redis: PersistentRedis,
) -> None:
    server = aof_redis.server
    with open_queue(server.url()) as queue:
        queue.put([_rollout(f"r{i:04d}") for i in range(2000)])
        queue.claim("holder", lease_s=600)  # loads the script: later claims are one EVALSHA each
        per_claim = []
        for held in (1, 500):
            while queue.stats().leased < held:
                queue.claim("holder", lease_s=600)
            before = _commands_run(server.port, server.password)
            assert queue.claim("w", lease_s=600) is not None
            per_claim.append(_commands_run(server.port, server.password) - before)
    assert per_claim[0] == per_claim[1] <= 12, per_claim  # Redis commands per claim: the same with 500 leases out
