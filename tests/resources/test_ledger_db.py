"""The ledger's DuckDB file: migration, reading while a run writes, read-only queries, the Dagster wrapper.

Views, records, prices and docs: tests/resources/test_ledger.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from resources.ledger import Ledger
from resources.ledger.db import LedgerLockedError, LedgerQueryError, query_ledger
from resources.ledger.schema import SCHEMA_VERSION, LedgerSchemaError
from tests.paths import REPO_ROOT
from tests.procs import ProcessLines

REPO = REPO_ROOT


def rows(ledger: Ledger, sql: str) -> list[dict]:
    return ledger.query(sql).as_dicts()


# --- migration --------------------------------------------------------------------------

V0_LEDGER_SQL = """
CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL, note VARCHAR NOT NULL);
INSERT INTO schema_version VALUES (0, '2026-01-01', 'created');
CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, started_at TIMESTAMP NOT NULL, ended_at TIMESTAMP,
    status VARCHAR NOT NULL,
    preset VARCHAR, store_url VARCHAR, queue_url VARCHAR, config JSON, price_table JSON);
CREATE TABLE iterations (iteration INTEGER PRIMARY KEY, weights_version INTEGER, started_at TIMESTAMP NOT NULL,
    ended_at TIMESTAMP, critical_path_s DOUBLE, status VARCHAR NOT NULL);
CREATE TABLE phases (iteration INTEGER NOT NULL, phase VARCHAR NOT NULL, started_at TIMESTAMP NOT NULL,
    ended_at TIMESTAMP, PRIMARY KEY (iteration, phase));
CREATE TABLE workers (worker_id VARCHAR PRIMARY KEY, role VARCHAR NOT NULL, instance_type VARCHAR NOT NULL,
    gpu_type VARCHAR, num_gpus INTEGER NOT NULL, spot BOOLEAN NOT NULL, usd_per_hour DOUBLE NOT NULL,
    price_source VARCHAR NOT NULL, started_at TIMESTAMP NOT NULL, ended_at TIMESTAMP, end_reason VARCHAR);
CREATE TABLE requests (request_id VARCHAR PRIMARY KEY, iteration INTEGER NOT NULL, kind VARCHAR NOT NULL,
    prompt VARCHAR NOT NULL, seed BIGINT NOT NULL, weights_version INTEGER NOT NULL, worker_id VARCHAR,
    attempts INTEGER NOT NULL, result_hash VARCHAR, reward DOUBLE, enqueued_at TIMESTAMP, finished_at TIMESTAMP,
    arm VARCHAR);
CREATE TABLE preemptions (worker_id VARCHAR NOT NULL, preempted_at TIMESTAMP NOT NULL, notice_s DOUBLE NOT NULL,
    request_id VARCHAR, steps_lost INTEGER NOT NULL, seconds_lost DOUBLE, state_committed BOOLEAN NOT NULL,
    PRIMARY KEY (worker_id, preempted_at));
CREATE TABLE syncs (version INTEGER NOT NULL, kind VARCHAR NOT NULL, iteration INTEGER, dense_bytes BIGINT NOT NULL,
    patch_bytes BIGINT NOT NULL, changed_fraction DOUBLE, encode_s DOUBLE, apply_s DOUBLE, weights_hash VARCHAR,
    PRIMARY KEY (version, kind));
CREATE TABLE exploration (iteration INTEGER PRIMARY KEY, arm VARCHAR NOT NULL, budget_s DOUBLE NOT NULL,
    time_used_s DOUBLE NOT NULL, num_requests INTEGER NOT NULL, reward_variance DOUBLE, rank_consistency DOUBLE,
    ucb_score DOUBLE);
CREATE TABLE validation (iteration INTEGER PRIMARY KEY, weights_version INTEGER NOT NULL, score DOUBLE NOT NULL,
    num_prompts INTEGER NOT NULL, recorded_at TIMESTAMP NOT NULL, criteria_json JSON);
INSERT INTO runs VALUES ('old', '2026-01-01 00:00', '2026-01-01 01:00', 'succeeded', 'cpu_tiny', NULL, NULL,
    '{}', '{}');
INSERT INTO workers VALUES ('w0', 'rollout', 'local', 'L4', 1, true, 1.0, 'given', '2026-01-01 00:00',
    '2026-01-01 01:00', 'finished');
INSERT INTO iterations VALUES (0, 0, '2026-01-01 00:00', '2026-01-01 01:00', 3600, 'succeeded');
INSERT INTO requests VALUES ('r0', 0, 'rollout', 'a red cube', 7, 0, 'w0', 1, 'h0', 0.5, NULL, NULL, NULL);
INSERT INTO validation VALUES (0, 1, 0.42, 8, '2026-01-01 01:00', '{"counting": 0.25, "color": 0.75}');
INSERT INTO syncs VALUES (1, 'patch', 0, 5000, 120, 0.01, 0.1, 0.2, 'abc');
INSERT INTO exploration VALUES (0, 'm8-none', 10.0, 2.5, 64, 0.03, 0.8, 1.2);
"""


def _schema(con_or_ledger) -> list[tuple]:
    sql = (
        "SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_name != 'schema_version' ORDER BY table_name, column_name"
    )
    if isinstance(con_or_ledger, Ledger):
        return con_or_ledger.query(sql).rows
    return con_or_ledger.execute(sql).fetchall()


def test_opening_a_v0_ledger_migrates_it_and_keeps_every_row(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute(V0_LEDGER_SQL)
    ledger = Ledger(path)
    assert ledger.upgraded_from == 0
    assert rows(ledger, "SELECT max(version) AS v FROM schema_version")[0]["v"] == SCHEMA_VERSION
    assert rows(ledger, "SELECT request_id, prompt, reward, status FROM requests") == [
        {"request_id": "r0", "prompt": "a red cube", "reward": 0.5, "status": "done"}
    ]
    # Every validation before v4 was MiniGenEval's detector (its strict score): the migration says so.
    assert rows(ledger, "SELECT iteration, score, reward FROM validation") == [
        {"iteration": 0, "score": 0.42, "reward": "minigeneval_strict"}
    ]
    assert rows(ledger, "SELECT reward_components FROM requests") == [{"reward_components": None}]
    assert rows(ledger, "SELECT criterion, score FROM validation_scores ORDER BY criterion") == [
        {"criterion": "color", "score": 0.75},
        {"criterion": "counting", "score": 0.25},
    ]
    assert rows(ledger, "SELECT usd_total FROM cost_per_iteration")[0]["usd_total"] == pytest.approx(1.0)
    assert rows(ledger, "SELECT version, kind, replica, patch_bytes, weights_hash FROM syncs") == [
        {"version": 1, "kind": "patch", "replica": 0, "patch_bytes": 120, "weights_hash": "abc"}
    ]
    assert rows(ledger, "SELECT arm, rank_consistency, kendall_tau FROM exploration") == [
        {"arm": "m8-none", "rank_consistency": 0.8, "kendall_tau": None}
    ]
    assert _schema(ledger) == _schema(Ledger.in_memory())  # migrated == freshly created


def test_a_ledger_from_a_newer_spotlight_is_refused_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger(path).query("INSERT INTO schema_version VALUES (99, '2030-01-01', 'future')")
    with pytest.raises(
        LedgerSchemaError, match=rf"schema v99, newer than this spotlight understands \(v{SCHEMA_VERSION}\)"
    ):
        Ledger(path)


def test_a_foreign_duckdb_file_is_refused_not_modified(tmp_path: Path) -> None:
    path = tmp_path / "other.duckdb"
    with duckdb.connect(str(path)) as con:
        con.execute("CREATE TABLE sales (x INTEGER)")
    with pytest.raises(LedgerSchemaError, match="not a spotlight ledger"):
        Ledger(path)
    with duckdb.connect(str(path)) as con:
        assert [r[0] for r in con.execute("SHOW TABLES").fetchall()] == ["sales"]


# --- reading while a run writes ---------------------------------------------------------

_WRITER = textwrap.dedent("""
    import sys, time
    from resources.ledger import Ledger
    from resources.ledger.records import RequestRecord
    from pathlib import Path
    ledger = Ledger(sys.argv[1])
    stop = Path(sys.argv[2])
    print("ready", flush=True)
    end = time.monotonic() + 120  # a bound if the test dies before it asks the writer to stop
    i = 0
    while not stop.exists() and time.monotonic() < end:
        ledger.record_request(RequestRecord(f"r-{i}", 0, "rollout", "p", i, 0, "w", 1, reward=0.5))
        i += 1
    print(i, flush=True)
""")


def test_a_reader_works_while_a_writer_is_recording(tmp_path: Path) -> None:
    path, stop = tmp_path / "ledger.duckdb", tmp_path / "stop"
    writer = ProcessLines(
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), str(stop)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    )
    # The writer records until told to stop, so the reads fall inside its writing however
    # loaded the machine is (a writer on a clock could finish before a slow reader's first read).
    try:
        writer.expect("ready", timeout_s=60)
        seen: list[int] = []
        deadline = time.monotonic() + 60
        while len(set(seen)) < 3 and time.monotonic() < deadline:
            seen.append(query_ledger(path, "SELECT count(*) FROM requests", timeout_s=10).rows[0][0])
            assert writer.proc.poll() is None, "the writer ended before the reads did"
            time.sleep(0.05)
        stop.touch()
        written = int(writer.finish(timeout_s=60)[0][-1])
    finally:
        stop.touch()
        writer.proc.kill()
    assert len(set(seen)) >= 3, f"the reads saw no new rows while the writer recorded: {seen}"
    assert seen == sorted(seen) and seen[-1] <= written  # each read is a consistent snapshot
    assert query_ledger(path, "SELECT count(*) FROM requests").rows[0][0] == written


def test_a_ledger_held_open_elsewhere_gives_a_clear_locked_message(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger(path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, time; c = duckdb.connect({str(path)!r}); print('held', flush=True); time.sleep(20)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ProcessLines(holder).expect("held", timeout_s=60)
        with pytest.raises(LedgerLockedError, match=r"stayed locked for 0.5 s by another process .*PID"):
            query_ledger(path, "SELECT 1", timeout_s=0.5)
    finally:
        holder.kill()
        holder.wait()


def test_read_only_queries_cannot_change_the_ledger_or_touch_files(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger(path)
    with pytest.raises(LedgerQueryError, match="read-only"):
        query_ledger(path, "DELETE FROM runs")
    with pytest.raises(LedgerQueryError, match="disabled by configuration"):
        query_ledger(path, f"COPY runs TO '{tmp_path / 'leak.csv'}'")


# --- Dagster wrappers and import hygiene ------------------------------------------------


def test_dagster_resources_reject_bad_urls_at_load_and_open_working_clients(tmp_path: Path) -> None:
    from dagster import materialize

    from resources.dagster_resources import LedgerResource, TensorStoreResource

    with pytest.raises(Exception, match="unsupported store URL scheme 'gs'"):
        TensorStoreResource(url="gs://bucket/prefix")
    store = TensorStoreResource(url=str(tmp_path / "store"))
    ledger = LedgerResource(path=str(tmp_path / "ledger.duckdb"))

    from dagster import asset

    @asset(required_resource_keys={"store", "ledger"})
    def probe(context) -> None:  # resources by key: annotations are strings under __future__ here
        context.resources.store.get_store().publish("probe/1", {"x": b"1"})
        context.resources.ledger.get_ledger().start_run("probe-run")

    assert materialize([probe], resources={"store": store, "ledger": ledger}).success
    assert store.get_store().load_bytes("probe/1", "x") == b"1"
    assert query_ledger(tmp_path / "ledger.duckdb", "SELECT run_id FROM runs").rows == [("probe-run",)]


def test_plain_clients_import_neither_dagster_nor_torch() -> None:
    code = (
        "import sys, resources.store.base, resources.store, resources.store.local, resources.store.s3, "
        "resources.ledger, resources.ledger.db, resources.prices, resources.keys; "
        "print(sorted(m for m in ('dagster', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
