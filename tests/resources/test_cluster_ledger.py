"""The ledger rows of an SP node (`python -m workers.sp`): several groups and exploring members on one worker id.

The node prints every request's events under its own worker id, each with the `group` that runs it (`w0+w1`, or
the member `w2` for an exploration request), so the tracker follows each group's request on its own. A rollout
worker's events carry no group; tests/resources/test_cluster.py and test_worker_events.py cover those.
"""

from __future__ import annotations

import pytest

from resources.cluster.ledger import WorkTracker
from resources.cluster.worker_events import RemoteWorkers

G1, G2 = "w0+w1", "w2+w3"


def _claim(group: str, request_id: str, attempt: int = 1, resumed_from_step: int = 0) -> tuple:
    return "claim", {
        "group": group,
        "request_id": request_id,
        "attempt": attempt,
        "resumed_from_step": resumed_from_step,
    }


def _step(group: str, request_id: str, step: int, step_s: float = 0.5) -> tuple:
    return "step", {"group": group, "request_id": request_id, "step": step, "step_s": step_s}


def _commit(group: str, request_id: str, step: int) -> tuple:
    return "commit", {"group": group, "request_id": request_id, "step": step, "commit_s": 0.01}


def _done(group: str, request_id: str) -> tuple:
    return "done", {"group": group, "request_id": request_id, "result_key": f"results/{request_id}"}


def _feed(tracker: WorkTracker, worker_id: str, *items: tuple) -> dict[tuple, float]:
    """Feed events at t = 100, 101, ...; returns each (event, group, request) -> its time."""
    times = {}
    for i, (kind, fields) in enumerate(items):
        t = 100.0 + i
        tracker.on_event({"t": t, "worker_id": worker_id, "event": kind, **fields})
        times.setdefault((kind, fields.get("group"), fields.get("request_id")), t)
    return times


def _attempts(ledger) -> dict[str, dict]:
    rows = ledger.query(
        "SELECT request_id, attempt, worker_id, epoch(started_at) AS started, epoch(ended_at) AS ended, "
        "outcome, resumed_from_step, steps_done, steps_lost FROM attempts"
    ).as_dicts()
    return {row.pop("request_id"): row for row in rows}


INTERLEAVED = (
    _claim(G1, "r1"),
    _claim(G2, "r2"),
    _step(G1, "r1", 1),
    _step(G2, "r2", 1),
    _step(G1, "r1", 2),
    _commit(G1, "r1", 2),
    _step(G2, "r2", 2),
    _commit(G2, "r2", 2),
    _step(G1, "r1", 3),
    _step(G1, "r1", 4),
    _done(G1, "r1"),
    _claim(G1, "r3", attempt=2, resumed_from_step=2),  # a request another worker had started
    _step(G2, "r2", 3),
    _step(G2, "r2", 4),
    _done(G2, "r2"),
    _claim(G2, "r4"),
    ("claim", {"group": "w0", "request_id": "e1", "kind": "explore", "attempt": 1, "resumed_from_step": 0}),
    ("done", {"group": "w0", "request_id": "e1", "kind": "explore", "result_key": "explore/e1"}),
    _step(G1, "r3", 3),
    _step(G2, "r4", 1),
    _step(G1, "r3", 4),
    _commit(G1, "r3", 4),
    _step(G2, "r4", 2),
    _step(G1, "r3", 5, step_s=0.25),
)


def test_interleaved_groups_of_one_node_each_get_their_own_attempt_rows(mem_ledger) -> None:
    tracker = WorkTracker(mem_ledger)
    times = _feed(tracker, "n0", *INTERLEAVED)
    attempts = _attempts(mem_ledger)
    assert set(attempts) == {"r1", "r2", "e1"}  # r3 and r4 are still running
    for rid, group in (("r1", G1), ("r2", G2), ("e1", "w0")):
        assert attempts[rid] == {
            "attempt": 1,
            "worker_id": "n0",
            "started": times[("claim", group, rid)],
            "ended": times[("done", group, rid)],
            "outcome": "done",
            "resumed_from_step": 0,
            "steps_done": 4 if rid != "e1" else 0,
            "steps_lost": 0,
        }


def test_a_node_killed_mid_request_charges_each_request_in_flight_its_own_lost_steps(mem_ledger) -> None:
    tracker = WorkTracker(mem_ledger)
    times = _feed(tracker, "n0", *INTERLEAVED)
    record = tracker.preemption("n0", 130.0, notice_s=0.0, ended_at=131.0)
    # r3 lost step 5 (0.25 s) since its commit at 4; r4 lost steps 1-2 (1 s) and had committed nothing.
    assert (record.steps_lost, record.seconds_lost, record.state_committed) == (3, 1.25, False)
    assert record.request_id is None  # two were in flight: each one's attempt row says what it lost
    attempts = _attempts(mem_ledger)
    assert attempts["r3"] == {
        "attempt": 2,
        "worker_id": "n0",
        "started": times[("claim", G1, "r3")],
        "ended": 131.0,
        "outcome": "preempted",
        "resumed_from_step": 2,
        "steps_done": 3,
        "steps_lost": 1,
    }
    assert attempts["r4"] == {
        "attempt": 1,
        "worker_id": "n0",
        "started": times[("claim", G2, "r4")],
        "ended": 131.0,
        "outcome": "preempted",
        "resumed_from_step": 0,
        "steps_done": 2,
        "steps_lost": 2,
    }
    assert attempts["r1"]["outcome"] == attempts["r2"]["outcome"] == "done"  # finished before: not charged
    (row,) = mem_ledger.query("SELECT worker_id, request_id, steps_lost, seconds_lost FROM preemptions").rows
    assert row == ("n0", None, 3, 1.25)


def test_a_request_resumed_on_a_re_formed_group_is_charged_once_from_its_new_group(mem_ledger) -> None:
    """A member of G1 is lost: G1's request unwinds (group_lost), G2 commits at its step boundary (preempted), the
    survivors re-form and both requests resume on their new groups; then the node is killed."""
    tracker = WorkTracker(mem_ledger)
    _feed(
        tracker,
        "n0",
        _claim(G1, "r1"),
        _claim(G2, "r2"),
        _step(G1, "r1", 1),
        _commit(G1, "r1", 1),
        _step(G2, "r2", 1),
        _step(G1, "r1", 2),
        ("group_lost", {"group": G1, "request_id": "r1", "dead": ["w1"], "error": None}),
        _commit(G2, "r2", 1),
        ("preempted", {"group": G2, "request_id": "r2", "step": 1, "committed_step": 1}),
        ("formed", {"generation": 2, "degree": 1, "groups": [["w0"], ["w2"], ["w3"]]}),
        _claim("w0", "r1", resumed_from_step=1),
        _claim("w2", "r2", resumed_from_step=1),
        _step("w0", "r1", 2),
        _step("w2", "r2", 2),
        _step("w2", "r2", 3),
    )
    record = tracker.preemption("n0", 130.0, notice_s=0.0, ended_at=131.0)
    assert (record.steps_lost, record.state_committed) == (3, True)  # r1: step 2; r2: steps 2-3; both had commits
    rows = mem_ledger.query(
        "SELECT request_id, outcome, resumed_from_step, steps_done, steps_lost FROM attempts ORDER BY request_id"
    ).rows
    assert rows == [("r1", "preempted", 1, 1, 1), ("r2", "preempted", 1, 2, 2)]


def _node_events(*items: tuple) -> list[dict]:
    return [{"t": 100.0 + i, "worker_id": "n0", "event": kind, **fields} for i, (kind, fields) in enumerate(items)]


NODE_READY = (
    "ready",
    {
        "instance_type": "sky-aws-us-east-1",
        "gpu_type": "H100",
        "spot": True,
        "usd_per_hour": None,
        "num_gpus": 4,
        "workers": {"w0": 11, "w1": 12, "w2": 13, "w3": 14},
    },
)


def test_an_sp_node_is_one_worker_costed_for_every_gpu_it_holds(mem_ledger) -> None:
    remote = RemoteWorkers(None, mem_ledger)
    for event in _node_events(NODE_READY, ("exit", {"reason": "idle"})):
        remote.on_event(event)
    (row,) = mem_ledger.query("SELECT num_gpus, usd_per_hour FROM workers").rows
    per_gpu, _ = mem_ledger.prices.usd_per_hour("H100", spot=True)
    assert row == (4, pytest.approx(4 * per_gpu))


def test_an_sp_node_stopped_by_sigterm_commits_every_group_and_loses_nothing(mem_ledger) -> None:
    remote = RemoteWorkers(None, mem_ledger)
    for event in _node_events(
        NODE_READY,
        _claim(G1, "r1"),
        _claim(G2, "r2"),
        _step(G1, "r1", 1),
        _step(G2, "r2", 1),
        _commit(G2, "r2", 1),  # each group commits at its next step boundary, then stops
        ("preempted", {"group": G2, "request_id": "r2", "step": 1, "committed_step": 1}),
        _commit(G1, "r1", 1),
        ("preempted", {"group": G1, "request_id": "r1", "step": 1, "committed_step": 1}),
        ("exit", {"reason": "stopped"}),
    ):
        remote.on_event(event)
    (row,) = mem_ledger.query(
        "SELECT epoch(preempted_at), notice_s, request_id, steps_lost, state_committed FROM preemptions"
    ).rows
    assert row == (106.0, pytest.approx(3.0), None, 0, True)  # signalled when the first group stopped
    rows = mem_ledger.query("SELECT request_id, outcome, epoch(ended_at), steps_lost FROM attempts ORDER BY 1").rows
    assert rows == [("r1", "preempted", 108.0, 0), ("r2", "preempted", 106.0, 0)]
