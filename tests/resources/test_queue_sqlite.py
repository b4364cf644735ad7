"""SQLite queue at scale: claim searches indexes only, acked requests leave the claim table, old files migrate.

The shared contract (both backends) is tests/resources/test_queue.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from resources.queue.sqlite import CLAIM_EXPIRED_SQL, CLAIM_PENDING_SQL, SqliteQueue


def rollout(rid: str, iteration: int = 0) -> dict:
    return {"request_id": rid, "iteration": iteration, "kind": "rollout", "payload": {}}


def _plan(path: Path, sql: str, params: tuple = ()) -> str:
    with sqlite3.connect(path) as db:
        return " | ".join(row[-1] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", params))


def test_claim_searches_indexes_instead_of_scanning_every_request(tmp_path: Path) -> None:
    with SqliteQueue(tmp_path / "q.db") as queue:
        queue.put([rollout(f"r{i}") for i in range(50)])
    # The pending index holds only pending rows in claim order: its first entry is the answer.
    assert _plan(tmp_path / "q.db", CLAIM_PENDING_SQL) == "SCAN requests USING INDEX requests_pending"
    # Expired leases: a range search of the leased rows past due (only those get sorted).
    assert _plan(tmp_path / "q.db", CLAIM_EXPIRED_SQL, (0.0,)).startswith(
        "SEARCH requests USING INDEX requests_leased (lease_until<?)"
    )


def test_acked_requests_leave_the_claim_table_but_stay_done_exactly_once(tmp_path: Path) -> None:
    with SqliteQueue(tmp_path / "q.db") as queue:
        queue.put([rollout("r0"), rollout("r1")])
        lease = queue.claim("w", lease_s=30)
        assert queue.ack(lease, "results/r0")
        with sqlite3.connect(tmp_path / "q.db") as db:
            assert [r[0] for r in db.execute("SELECT request_id FROM requests")] == ["r1"]
        assert queue.put([rollout("r0")]) == 0  # an acked id is still known
        assert not queue.ack("r0", "results/other")
        assert queue.states(["r0", "r1"]) == {"r0": "done", "r1": "pending"}
        assert queue.results(["r0", "r1"]) == {"r0": "results/r0"}
        assert queue.stats().done == 1 and queue.stats().pending == 1


def test_purging_finished_iterations_forgets_only_them(tmp_path: Path) -> None:
    with SqliteQueue(tmp_path / "q.db") as queue:
        queue.put([rollout("a", iteration=0), rollout("b", iteration=1), rollout("c", iteration=1)])
        for rid in ("a", "b"):
            queue.ack(rid, f"results/{rid}")
        assert queue.purge_finished(before_iteration=1) == 1
        assert queue.states(["a", "b", "c"]) == {"a": "unknown", "b": "done", "c": "pending"}
        assert queue.stats().done == 1
        assert queue.put([rollout("a", iteration=0)]) == 1  # forgotten: queued afresh


def test_a_queue_file_with_done_rows_in_the_old_layout_keeps_them_done(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    with SqliteQueue(path) as queue:
        queue.put([rollout("old"), rollout("open")])
    with sqlite3.connect(path) as db:  # what an older spotlight left: done rows in `requests`
        db.execute("DROP TABLE finished")
        db.execute("UPDATE requests SET state = 'done', result_key = 'results/old' WHERE request_id = 'old'")
    with SqliteQueue(path) as queue:
        assert queue.states(["old", "open"]) == {"old": "done", "open": "pending"}
        assert queue.results(["old"]) == {"old": "results/old"}
        assert queue.claim("w", lease_s=30).request_id == "open"
        assert queue.claim("w", lease_s=30) is None


def test_an_iteration_beyond_a_sqlite_integer_is_refused_before_anything_is_queued(tmp_path: Path) -> None:
    import pytest

    with SqliteQueue(tmp_path / "q.db") as queue:
        with pytest.raises(ValueError, match="iteration must be an int >= 0 and < 2"):
            queue.put([rollout("ok"), rollout("big", iteration=2**63)])  # was an OverflowError from sqlite3
        assert queue.stats().pending == 0
