"""Buffered ledger writes: rows recorded in a phase reach the file together, and what a crash may lose.

The durability rules are in resources/ledger/__init__.py's module docstring.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from resources.ledger import Ledger
from resources.ledger.db import query_ledger
from resources.ledger.records import AttemptRecord, RequestRecord
from tests.paths import REPO_ROOT


def attempt(i: int, outcome: str = "done") -> AttemptRecord:
    return AttemptRecord(f"r{i}", 1, "w0", started_at=1.7e9 + i, ended_at=1.7e9 + i + 1, outcome=outcome)


def _count(path: Path, table: str = "attempts") -> int:
    return query_ledger(path, f"SELECT count(*) FROM {table}").rows[0][0]


def test_rows_recorded_in_a_phase_reach_readers_when_the_phase_ends(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    with Ledger(path) as ledger:
        ledger.start_iteration(0)
        with ledger.phase(0, "rollout"):
            for i in range(3000):
                ledger.record_attempt(attempt(i))
            assert _count(path) == 0 and ledger.buffered_rows == 3000
        assert _count(path) == 3000 and ledger.buffered_rows == 0


def test_outside_a_phase_a_record_is_written_at_once(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    with Ledger(path) as ledger:
        ledger.record_attempt(attempt(0))
        assert _count(path) == 1


def test_the_writers_own_queries_see_its_buffered_rows(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.duckdb") as ledger, ledger.batch():
        ledger.record_attempt(attempt(0))
        assert ledger.query("SELECT count(*) FROM attempts").rows[0][0] == 1


def test_a_full_buffer_is_written_without_waiting_for_the_phase_end(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    with Ledger(path, flush_rows=100) as ledger, ledger.batch():
        for i in range(250):
            ledger.record_attempt(attempt(i))
        assert _count(path) == 200 and ledger.buffered_rows == 50


def test_re_recording_a_key_in_one_batch_keeps_the_last_row_as_one_by_one_writes_would(tmp_path: Path) -> None:
    with Ledger(tmp_path / "ledger.duckdb") as ledger:
        with ledger.batch():
            ledger.record_attempt(attempt(0, "running"))
            ledger.record_attempt(attempt(1, "running"))
            ledger.record_attempt(attempt(0, "preempted"))
            ledger.record_requests([RequestRecord("r0", 0, "rollout", "p", 7, 0, "w0", 1)])
        rows = ledger.query("SELECT request_id, outcome FROM attempts ORDER BY request_id").rows
        assert rows == [("r0", "preempted"), ("r1", "running")]
        assert ledger.query("SELECT count(*) FROM requests").rows[0][0] == 1


_CRASHER = textwrap.dedent("""
    import os, sys
    from resources.ledger import Ledger
    from resources.ledger.records import AttemptRecord
    ledger = Ledger(sys.argv[1])
    ledger.start_iteration(0)
    for phase, first in (("rollout", 0), ("train", 100)):
        with ledger.phase(0, phase):
            for i in range(first, first + 100):
                ledger.record_attempt(AttemptRecord(f"r{i}", 1, "w0", 1.7e9, 1.7e9 + 1, "done"))
            if sys.argv[2] == "kill" and phase == "train":
                os._exit(1)                       # a kill: no close, no atexit
    ledger.record_phase(0, "validate", 1.7e9)     # "exit": a phase left open, then a normal exit without close()
    for i in range(200, 250):
        ledger.record_attempt(AttemptRecord(f"r{i}", 1, "w0", 1.7e9, 1.7e9 + 1, "done"))
""")


def test_a_killed_writer_keeps_every_row_recorded_before_its_last_phase_end(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    subprocess.run([sys.executable, "-c", _CRASHER, str(path), "kill"], cwd=REPO_ROOT, check=False, timeout=120)
    assert _count(path) == 100  # the rollout phase's rows; the open train phase's buffer is lost
    assert query_ledger(path, "SELECT phase, ended_at IS NULL FROM phases ORDER BY phase").rows == [
        ("rollout", False),
        ("train", True),
    ]


def test_a_writer_that_exits_without_closing_still_writes_its_buffer(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    subprocess.run([sys.executable, "-c", _CRASHER, str(path), "exit"], cwd=REPO_ROOT, check=True, timeout=120)
    assert _count(path) == 250


def test_a_held_block_opens_the_file_once_and_other_processes_read_once_it_ends(tmp_path: Path, monkeypatch) -> None:
    """`held()`: the report's few dozen reads and writes on one connection (opening the file costs ~25 ms of CPU
    each time); a reader in another process waits while the block runs and reads every row after it."""
    import resources.ledger.file as ledger_file
    from resources.ledger.db import LedgerLockedError

    path = tmp_path / "ledger.duckdb"
    opened = []
    real_connect = ledger_file.connect
    monkeypatch.setattr(ledger_file, "connect", lambda *a, **k: opened.append(1) or real_connect(*a, **k))
    reader = [
        sys.executable,
        "-c",
        f"from resources.ledger.db import query_ledger; print(query_ledger({str(path)!r}, "
        "'SELECT count(*) FROM attempts', timeout_s=0.5).rows[0][0])",
    ]
    with Ledger(path) as ledger:
        opened.clear()
        with ledger.held():
            for i in range(20):
                ledger.record_attempt(attempt(i))  # outside a phase: written at once, on the held connection
                assert ledger.query("SELECT count(*) FROM attempts").rows == [(i + 1,)]
            with ledger.held():  # nested: the same connection
                ledger.start_iteration(0)
            assert len(opened) == 1
            waited = subprocess.run(reader, cwd=REPO_ROOT, capture_output=True, text=True)
            assert waited.returncode != 0 and LedgerLockedError.__name__ in waited.stderr
        done = subprocess.run(reader, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == "20"
        ledger.query("SELECT 1")
        assert len(opened) == 2  # outside the block each call opens the file again
