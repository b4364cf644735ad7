"""Preemption traces and the local cluster's bookkeeping (the end-to-end run is tests/resources/test_chaos.py)."""

from __future__ import annotations

import pytest

from resources.cluster import ClusterConfig, LocalCluster, WorkerSlot
from resources.cluster.ledger import WorkTracker
from resources.cluster.preemption import PreemptionEvent, load_trace_csv, poisson_trace


def test_a_csv_trace_is_read_in_time_order(tmp_path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("time_s,worker,notice_s\n# a comment\n4.0,w2,30\n2.5,w1,0\n")
    assert load_trace_csv(path, slots=["w1", "w2"]) == [
        PreemptionEvent(2.5, "w1", 0.0),
        PreemptionEvent(4.0, "w2", 30.0),
    ]


@pytest.mark.parametrize(
    "text,message",
    [
        ("when,who\n1,w0\n", "header"),
        ("time_s,worker,notice_s\n1,w0\n", "event 1"),
        ("time_s,worker,notice_s\n-1,w0,0\n", "time_s"),
        ("time_s,worker,notice_s\n1,w9,0\n", "unknown worker slot"),
    ],
)
def test_a_bad_trace_names_the_line_that_is_wrong(tmp_path, text, message) -> None:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_trace_csv(path, slots=["w0"])


def test_a_poisson_trace_has_the_asked_rate_and_share_of_notices_and_is_reproducible() -> None:
    slots = [f"w{i}" for i in range(10)]
    trace = poisson_trace(slots, rate_per_hour=360, duration_s=1000, notice_share=0.25, notice_s=30, seed=1)
    expected = 360 / 3600 * 1000 * len(slots)  # 1000 events
    assert 0.9 * expected < len(trace) < 1.1 * expected
    assert 0.2 < sum(e.notice_s > 0 for e in trace) / len(trace) < 0.3
    assert trace == sorted(trace) and all(e.time_s < 1000 for e in trace)
    assert trace == poisson_trace(slots, rate_per_hour=360, duration_s=1000, notice_share=0.25, notice_s=30, seed=1)


def test_bad_cluster_settings_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="commit_every"):
        ClusterConfig("q.db", "store", commit_every=0)
    with pytest.raises(ValueError, match="unique slot names"):
        LocalCluster(ClusterConfig("q.db", "store"), [WorkerSlot("w0"), WorkerSlot("w0")])
    with pytest.raises(ValueError, match="usd_per_hour"):
        WorkerSlot("w0", usd_per_hour=-1)
    with pytest.raises(ValueError, match="nice"):
        ClusterConfig("q.db", "store", nice=20)


@pytest.mark.slow
def test_workers_run_at_the_configured_niceness(tmp_path) -> None:
    """Beside a trainer on the same machine, the pool's workers must yield the CPU to it."""
    import os

    config = ClusterConfig(str(tmp_path / "q.db"), str(tmp_path / "store"), nice=7)
    with LocalCluster(config, [WorkerSlot("w0")]) as cluster:
        pids = [p.popen.pid for p in cluster._live.values()]
        assert [os.getpriority(os.PRIO_PROCESS, pid) for pid in pids] == [os.getpriority(os.PRIO_PROCESS, 0) + 7]


def test_a_slot_without_a_price_is_priced_from_the_table_by_gpu_and_capacity() -> None:
    spot, reserved = WorkerSlot("a", gpu_type="H100", spot=True), WorkerSlot("b", gpu_type="H100", spot=False)
    assert 0 < spot.price() < reserved.price()
    assert WorkerSlot("c").price() == 0.0


def _events(worker: str, *items: tuple) -> list[dict]:
    return [{"t": 100.0 + i, "worker_id": worker, "event": kind, **fields} for i, (kind, fields) in enumerate(items)]


def test_a_kill_without_notice_loses_the_steps_since_the_last_commit(mem_ledger) -> None:
    tracker = WorkTracker(mem_ledger)
    tracker.worker_started(
        "w0.0", role="rollout", instance_type="local-cpu", spot=True, usd_per_hour=0.4, gpu_type=None, at=99.0
    )
    for event in _events(
        "w0.0",
        ("claim", {"request_id": "r1", "attempt": 1, "resumed_from_step": 2}),
        ("step", {"request_id": "r1", "step": 3, "step_s": 0.5}),
        ("step", {"request_id": "r1", "step": 4, "step_s": 0.5}),
        ("commit", {"request_id": "r1", "step": 4, "commit_s": 0.01}),
        ("step", {"request_id": "r1", "step": 5, "step_s": 0.25}),
    ):
        tracker.on_event(event)
    record = tracker.preemption("w0.0", 106.0, notice_s=0.0, ended_at=106.0)
    assert (record.request_id, record.steps_lost, record.seconds_lost, record.state_committed) == ("r1", 1, 0.25, True)
    attempt = mem_ledger.query("SELECT outcome, resumed_from_step, steps_done FROM attempts").rows
    assert attempt == [("preempted", 2, 3)]


def test_a_worker_that_committed_on_its_notice_loses_nothing(mem_ledger) -> None:
    tracker = WorkTracker(mem_ledger)
    tracker.worker_started(
        "w0.0", role="rollout", instance_type="local-cpu", spot=True, usd_per_hour=0.4, gpu_type=None, at=99.0
    )
    for event in _events(
        "w0.0",
        ("claim", {"request_id": "r1", "attempt": 1, "resumed_from_step": 0}),
        ("step", {"request_id": "r1", "step": 1, "step_s": 0.5}),
        ("commit", {"request_id": "r1", "step": 1, "commit_s": 0.01}),
        ("preempted", {"request_id": "r1", "step": 1, "committed_step": 1}),
    ):
        tracker.on_event(event)
    record = tracker.preemption("w0.0", 102.5, notice_s=30.0, ended_at=104.0)
    assert (record.steps_lost, record.state_committed) == (0, True)
    assert mem_ledger.query("SELECT with_notice, steps_lost FROM preemption_summary").rows == [(1, 0)]
