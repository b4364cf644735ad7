"""Remote spot workers reach the ledger through the Redis queue; the run's spend reaches the spot workers' gate."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pytest

from resources.cluster.worker_events import RemoteWorkers, relay
from resources.queue import open_queue
from resources.queue.base import PASSWORD_ENV
from resources.run_status import EXIT_OVER_BUDGET, StatusPublisher, ledger_status


@pytest.fixture
def redis_queue(redis_server, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, redis_server.password)
    redis_server.flush()
    with open_queue(redis_server.url()) as queue:
        yield queue


def _lines(worker_id: str, *events: tuple[str, dict]) -> list[str]:
    t0 = time.time()
    return [
        json.dumps({"t": t0 + i * 0.1, "worker_id": worker_id, "event": kind, **fields}) + "\n"
        for i, (kind, fields) in enumerate(events)
    ]


READY = ("ready", {"instance_type": "sky-aws-us-east-1", "gpu_type": None, "spot": True, "usd_per_hour": 0.4})
CLAIM = ("claim", {"request_id": "r1", "attempt": 1, "resumed_from_step": 0})
STEPS = [
    ("step", {"request_id": "r1", "step": 1, "step_s": 0.5}),
    ("step", {"request_id": "r1", "step": 2, "step_s": 0.5}),
    ("commit", {"request_id": "r1", "step": 2, "commit_s": 0.01}),
    ("step", {"request_id": "r1", "step": 3, "step_s": 0.5}),
]


def test_a_spot_worker_stopped_by_a_notice_is_recorded_as_preempted_with_nothing_lost(redis_queue, mem_ledger) -> None:
    lines = _lines(
        "vm-1",
        READY,
        CLAIM,
        *STEPS,
        ("notice", {"cloud": "aws"}),
        ("preempted", {"request_id": "r1", "step": 3, "committed_step": 3}),
        ("exit", {"reason": "stopped"}),
    )
    echoed = io.StringIO()
    assert relay(["not json\n", *lines], redis_queue, echoed) == len(lines)
    assert echoed.getvalue().startswith("not json\n")  # the job log keeps every line
    with RemoteWorkers(redis_queue, mem_ledger):
        pass
    (worker,) = mem_ledger.query("SELECT * FROM workers").as_dicts()
    assert (worker["worker_id"], worker["end_reason"], worker["usd_per_hour"]) == ("vm-1", "preempted", 0.4)
    (preemption,) = mem_ledger.query("SELECT * FROM preemptions").as_dicts()
    assert preemption["request_id"] == "r1" and preemption["state_committed"] and preemption["steps_lost"] == 0
    assert preemption["notice_s"] > 0


def test_a_worker_whose_output_ends_without_exit_was_killed_and_loses_its_uncommitted_steps(
    redis_queue, mem_ledger
) -> None:
    relay(_lines("vm-2", READY, CLAIM, *STEPS), redis_queue, io.StringIO())  # SIGKILL: the pipe just ends
    with RemoteWorkers(redis_queue, mem_ledger):
        pass
    (preemption,) = mem_ledger.query("SELECT * FROM preemptions").as_dicts()
    assert preemption["notice_s"] == 0 and preemption["steps_lost"] == 1 and preemption["state_committed"]
    assert mem_ledger.query("SELECT end_reason FROM workers").rows == [("preempted",)]


def test_an_idle_exit_finishes_the_worker_and_one_alive_at_the_end_of_the_run_is_closed(
    redis_queue, mem_ledger
) -> None:
    relay(_lines("vm-3", READY, ("exit", {"reason": "idle"})), redis_queue, io.StringIO())
    with RemoteWorkers(redis_queue, mem_ledger) as remote:
        redis_queue.append_events([json.loads(_lines("vm-4", READY)[0])])  # still running when the run ends
        deadline = time.monotonic() + 10
        while "vm-4" not in remote.live and time.monotonic() < deadline:
            time.sleep(0.05)
    ends = dict(mem_ledger.query("SELECT worker_id, end_reason FROM workers").rows)
    assert ends == {"vm-3": "finished", "vm-4": "scaled_down"}
    assert mem_ledger.query("SELECT count(*) FROM preemptions").rows == [(0,)]


def test_the_spend_gate_stops_a_spot_job_once_the_published_spend_reached_the_cap(
    redis_server, redis_queue, mem_ledger
) -> None:
    now = time.time()
    mem_ledger.start_worker("w", role="rollout", instance_type="x", spot=True, usd_per_hour=3600.0, at=now - 2)
    mem_ledger.end_worker("w", reason="finished", at=now)  # $2 in all, however slowly the gate's process starts
    gate = [sys.executable, "-m", "resources.run_status", "--queue", redis_server.url()]
    with StatusPublisher(redis_queue, mem_ledger.query, {"max_usd": 100.0}):
        pass
    assert subprocess.run(gate, capture_output=True).returncode == 0
    assert redis_queue.info()["usd_total"] == pytest.approx(ledger_status(mem_ledger.query)["usd_total"]) == 2.0
    with StatusPublisher(redis_queue, mem_ledger.query, {"max_usd": 1.0}):
        pass
    over = subprocess.run(gate, capture_output=True, text=True)
    assert over.returncode == EXIT_OVER_BUDGET and "cap" in over.stderr
