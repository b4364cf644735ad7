"""The run ledger: views against hand-computed numbers, migration, concurrent reading, prices, docs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import pytest

from resources.ledger import Ledger
from resources.ledger_db import LedgerLockedError, query_ledger
from resources.ledger_records import (
    AttemptRecord,
    ExplorationRecord,
    PreemptionRecord,
    RequestRecord,
    SyncRecord,
    TrainStepRecord,
)
from resources.ledger_schema import SCHEMA_VERSION, LedgerSchemaError
from resources.prices import load_prices

REPO = Path(__file__).resolve().parents[1]
T0 = datetime(2026, 1, 1)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def fill_two_iterations(ledger: Ledger) -> None:
    """A small run whose costs are easy to compute by hand (see the view tests).

    trainer  reserved $4/h  0:00-2:00
    spot-a   spot     $1/h  0:00-2:00
    spot-b   spot     $1/h  0:00-0:30  preempted with 120 s notice, 2 steps lost, state committed
    spot-c   spot     $1/h  0:40-1:30  preempted without notice, 5 steps lost
    iteration 0: 0:00-1:00, iteration 1: 1:00-2:00
    """
    ledger.start_run("demo", preset="cpu_tiny", config={"lr": 1e-4}, store_url="file:///tmp/store", at=at(0))
    ledger.start_worker("trainer", role="trainer", instance_type="local-reserved", spot=False, usd_per_hour=4.0, at=at(0))
    for worker, start in (("spot-a", 0), ("spot-b", 0), ("spot-c", 40)):
        ledger.start_worker(worker, role="rollout", instance_type="g6.xlarge", gpu_type="L4", spot=True, usd_per_hour=1.0, at=at(start))
    phases = {"sync": (0, 6), "rollout": (6, 30), "train": (30, 54), "explore": (30, 50), "validate": (55, 60)}
    for iteration in (0, 1):
        base = 60 * iteration
        ledger.start_iteration(iteration, weights_version=iteration, at=at(base))
        for phase, (start, end) in phases.items():
            end = 56 if (iteration, phase) == (1, "explore") else end  # explore overruns train in it 1
            ledger.record_phase(iteration, phase, at(base + start), at(base + end))
        ledger.end_iteration(iteration, at=at(base + 60))
        ledger.record_sync(SyncRecord(iteration, "anchor" if iteration == 0 else "patch", 1000, 1000 if iteration == 0 else 40,
                                      iteration=iteration, changed_fraction=None if iteration == 0 else 0.01, encode_s=0.5, apply_s=0.1))
        ledger.record_exploration(ExplorationRecord(iteration, "taylorseer-3", budget_s=1440, time_used_s=1200 + 360 * iteration,
                                                    num_requests=16, reward_variance=0.02, rank_consistency=0.8))
        ledger.record_train_steps([TrainStepRecord(iteration, s, loss=0.1, kl=0.01, reward_mean=0.4 + 0.1 * iteration,
                                                   reward_std=0.2, zero_std_ratio=0.25) for s in range(2)])
        ledger.record_validation(iteration, weights_version=iteration + 1, score=(0.40, 0.55)[iteration], num_prompts=8,
                                 criteria={"counting": (0.2, 0.4)[iteration], "color": (0.6, 0.7)[iteration]}, at=at(base + 60))
    ledger.end_worker("spot-b", reason="preempted", at=at(30))
    ledger.record_preemption(PreemptionRecord("spot-b", at(30), notice_s=120, steps_lost=2, state_committed=True, request_id="r-1"))
    ledger.end_worker("spot-c", reason="preempted", at=at(90))
    ledger.record_preemption(PreemptionRecord("spot-c", at(90), notice_s=0, steps_lost=5, state_committed=False, request_id="r-9"))
    ledger.record_requests([
        RequestRecord(f"r-{i}", i // 8, "rollout", f"prompt {i % 4}", seed=i, weights_version=i // 8,
                      worker_id="spot-a", attempts=2 if i in (1, 9) else 1, result_hash=f"h{i}", reward=0.5,
                      enqueued_at=at(6 + 60 * (i // 8)), finished_at=at(20 + 60 * (i // 8)))
        for i in range(16)
    ])
    ledger.record_attempt(AttemptRecord("r-1", 1, "spot-b", at(10), at(30), "preempted", steps_done=2))
    ledger.record_attempt(AttemptRecord("r-1", 2, "spot-a", at(31), at(32), "done", resumed_from_step=2, steps_done=6))
    for worker in ("trainer", "spot-a"):
        ledger.end_worker(worker, reason="finished", at=at(120))
    ledger.end_run("demo", at=at(120))


@pytest.fixture
def filled(mem_ledger: Ledger) -> Ledger:
    fill_two_iterations(mem_ledger)
    return mem_ledger


def rows(ledger: Ledger, sql: str) -> list[dict]:
    return ledger.query(sql).as_dicts()


# --- views give the hand-computed numbers --------------------------------------------------


def test_cost_per_iteration_matches_a_hand_computation(filled: Ledger) -> None:
    it0, it1 = rows(filled, "SELECT * FROM cost_per_iteration")
    # it 0: trainer 1 h x $4; spot-a 1 h, spot-b 0.5 h, spot-c 20 min, all at $1.
    assert it0["usd_reserved"] == pytest.approx(4.0)
    assert it0["usd_spot"] == pytest.approx(1 + 0.5 + 1 / 3)
    assert it0["usd_total"] == pytest.approx(4 + 1.5 + 1 / 3)
    assert it0["spot_share"] == pytest.approx((1.5 + 1 / 3) / (5.5 + 1 / 3))
    # rollout 0:06-0:30 (0.4 h): trainer $1.60, spot-a and spot-b $0.40 each.
    assert it0["usd_rollout"] == pytest.approx(1.6 + 0.8)
    assert it0["wall_s"] == 3600 and it0["critical_path_s"] == pytest.approx(3540)  # 1-min gap before validate
    # it 1: trainer $4, spot-a $1, spot-c 30 min.
    assert (it1["usd_reserved"], it1["usd_spot"]) == (pytest.approx(4.0), pytest.approx(1.5))


def test_cost_per_phase_splits_spot_and_reserved(filled: Ledger) -> None:
    sync0 = rows(filled, "SELECT * FROM cost_per_phase WHERE iteration = 0 AND phase = 'sync'")[0]
    assert sync0["wall_s"] == 360
    assert sync0["usd_reserved"] == pytest.approx(4 * 0.1)
    assert sync0["usd_spot"] == pytest.approx(2 * 0.1)
    assert [r["phase"] for r in rows(filled, "SELECT phase FROM cost_per_phase WHERE iteration = 1")] == [
        "sync", "rollout", "train", "explore", "validate"]


def test_run_cost_counts_every_worker_lifetime(filled: Ledger) -> None:
    run = rows(filled, "SELECT * FROM run_cost")[0]
    assert run["usd_reserved"] == pytest.approx(8.0)
    assert run["usd_spot"] == pytest.approx(2 + 0.5 + 50 / 60)
    assert run["spot_hours"] == pytest.approx(2 + 0.5 + 50 / 60)
    assert run["usd_outside_iterations"] == pytest.approx(0.0)


def test_preemption_summary_matches_a_hand_computation(filled: Ledger) -> None:
    (summary,) = rows(filled, "SELECT * FROM preemption_summary")
    assert summary["instance_type"] == "g6.xlarge" and summary["spot_workers"] == 3
    assert summary["preemptions"] == 2 and summary["with_notice"] == 1 and summary["without_notice"] == 1
    assert summary["preemptions_per_hour"] == pytest.approx(2 / (2 + 0.5 + 50 / 60))
    assert summary["steps_lost"] == 7 and summary["steps_lost_per_preemption"] == pytest.approx(3.5)
    assert summary["state_committed"] == 1


def test_validation_curve_tracks_best_score_elapsed_time_and_spend(filled: Ledger) -> None:
    first, second = rows(filled, "SELECT * FROM validation_curve")
    assert (first["score"], first["delta"], first["elapsed_s"]) == (0.40, None, 3600)
    assert second["best_score"] == 0.55 and second["delta"] == pytest.approx(0.15)
    assert second["cumulative_usd"] == pytest.approx(4 + 1.5 + 1 / 3 + 5.5)
    scores = rows(filled, "SELECT criterion, score FROM validation_scores WHERE iteration = 1 ORDER BY criterion")
    assert scores == [{"criterion": "color", "score": 0.7}, {"criterion": "counting", "score": 0.4}]


def test_rerecording_rows_replaces_them_instead_of_duplicating(filled: Ledger) -> None:
    fill_two_iterations(filled)  # a resumed run records the same facts again
    counts = rows(filled, "SELECT (SELECT count(*) FROM requests) AS r, (SELECT count(*) FROM iterations) AS i, "
                          "(SELECT count(*) FROM validation_scores) AS v, (SELECT count(*) FROM runs) AS runs")[0]
    assert counts == {"r": 16, "i": 2, "v": 4, "runs": 1}


def test_each_replica_of_a_trainer_round_keeps_its_own_sync_row(mem_ledger: Ledger) -> None:
    for replica, sent in ((0, 300), (1, 280)):
        mem_ledger.record_sync(SyncRecord(4, "pulseloco", 10_000, sent, iteration=4, replica=replica))
    mem_ledger.record_sync(SyncRecord(4, "pulseloco", 10_000, 290, iteration=4, replica=1))  # a re-record replaces
    assert rows(mem_ledger, "SELECT replica, patch_bytes FROM syncs ORDER BY replica") == [
        {"replica": 0, "patch_bytes": 300}, {"replica": 1, "patch_bytes": 290}]


def test_worker_priced_from_the_table_records_price_and_source(mem_ledger: Ledger) -> None:
    usd = mem_ledger.start_worker("w", role="rollout", instance_type="a3-highgpu-8g", gpu_type="h100", num_gpus=8, spot=True, at=at(0))
    row = rows(mem_ledger, "SELECT usd_per_hour, price_source FROM workers")[0]
    assert usd == pytest.approx(8 * load_prices().price("H100").spot_usd_per_gpu_hour)
    assert row["usd_per_hour"] == pytest.approx(usd) and "approximate" in row["price_source"]


@pytest.mark.parametrize("call, message", [
    (lambda l: l.record_phase(0, "warmup", at(0)), "phase must be one of"),
    (lambda l: l.start_worker("w", role="rollout", instance_type="x", spot=True), "give gpu_type"),
    (lambda l: l.start_worker("w", role="rollout", instance_type="x", gpu_type="TPU-v9", spot=True), "no price for GPU type"),
    (lambda l: l.end_worker("ghost", reason="finished"), "never started"),
    (lambda l: l.record_request(RequestRecord("r", 0, "train", "p", 1, 0, None, 1)), "kind must be one of"),
])
def test_bad_records_raise_actionable_value_errors(mem_ledger: Ledger, call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(mem_ledger)


# --- prices -----------------------------------------------------------------------------


def test_user_price_yaml_overrides_and_extends_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("gpus:\n  H100: {spot_usd_per_gpu_hour: 1.25}\n  MI300X: {on_demand_usd_per_gpu_hour: 3.0, spot_usd_per_gpu_hour: 1.5}\n")
    table = load_prices(path)
    assert table.price("H100").spot_usd_per_gpu_hour == 1.25
    assert table.price("H100").on_demand_usd_per_gpu_hour == load_prices().price("H100").on_demand_usd_per_gpu_hour
    assert table.usd_per_hour("MI300X", spot=False, num_gpus=2)[0] == 6.0


def test_bad_price_yaml_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("gpus:\n  NEWGPU: {spot_usd_per_gpu_hour: 1.0}\n")
    with pytest.raises(ValueError, match="needs on_demand_usd_per_gpu_hour"):
        load_prices(path)


def test_every_default_price_names_a_source_and_date() -> None:
    for name, price in load_prices().gpus.items():
        assert price.source and re.match(r"\d{4}-\d{2}-\d{2}", price.as_of), name
        assert 0 < price.spot_usd_per_gpu_hour < price.on_demand_usd_per_gpu_hour, name


# --- migration --------------------------------------------------------------------------

V0_LEDGER_SQL = """
CREATE TABLE schema_version (version INTEGER NOT NULL, applied_at TIMESTAMP NOT NULL, note VARCHAR NOT NULL);
INSERT INTO schema_version VALUES (0, '2026-01-01', 'created');
CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, started_at TIMESTAMP NOT NULL, ended_at TIMESTAMP, status VARCHAR NOT NULL,
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
    attempts INTEGER NOT NULL, result_hash VARCHAR, reward DOUBLE, enqueued_at TIMESTAMP, finished_at TIMESTAMP, arm VARCHAR);
CREATE TABLE preemptions (worker_id VARCHAR NOT NULL, preempted_at TIMESTAMP NOT NULL, notice_s DOUBLE NOT NULL,
    request_id VARCHAR, steps_lost INTEGER NOT NULL, seconds_lost DOUBLE, state_committed BOOLEAN NOT NULL,
    PRIMARY KEY (worker_id, preempted_at));
CREATE TABLE syncs (version INTEGER NOT NULL, kind VARCHAR NOT NULL, iteration INTEGER, dense_bytes BIGINT NOT NULL,
    patch_bytes BIGINT NOT NULL, changed_fraction DOUBLE, encode_s DOUBLE, apply_s DOUBLE, weights_hash VARCHAR,
    PRIMARY KEY (version, kind));
CREATE TABLE exploration (iteration INTEGER PRIMARY KEY, arm VARCHAR NOT NULL, budget_s DOUBLE NOT NULL,
    time_used_s DOUBLE NOT NULL, num_requests INTEGER NOT NULL, reward_variance DOUBLE, rank_consistency DOUBLE, ucb_score DOUBLE);
CREATE TABLE validation (iteration INTEGER PRIMARY KEY, weights_version INTEGER NOT NULL, score DOUBLE NOT NULL,
    num_prompts INTEGER NOT NULL, recorded_at TIMESTAMP NOT NULL, criteria_json JSON);
INSERT INTO runs VALUES ('old', '2026-01-01 00:00', '2026-01-01 01:00', 'succeeded', 'cpu_tiny', NULL, NULL, '{}', '{}');
INSERT INTO workers VALUES ('w0', 'rollout', 'local', 'L4', 1, true, 1.0, 'given', '2026-01-01 00:00', '2026-01-01 01:00', 'finished');
INSERT INTO iterations VALUES (0, 0, '2026-01-01 00:00', '2026-01-01 01:00', 3600, 'succeeded');
INSERT INTO requests VALUES ('r0', 0, 'rollout', 'a red cube', 7, 0, 'w0', 1, 'h0', 0.5, NULL, NULL, NULL);
INSERT INTO validation VALUES (0, 1, 0.42, 8, '2026-01-01 01:00', '{"counting": 0.25, "color": 0.75}');
INSERT INTO syncs VALUES (1, 'patch', 0, 5000, 120, 0.01, 0.1, 0.2, 'abc');
INSERT INTO exploration VALUES (0, 'm8-none', 10.0, 2.5, 64, 0.03, 0.8, 1.2);
"""


def _schema(con_or_ledger) -> list[tuple]:
    sql = ("SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns "
           "WHERE table_name != 'schema_version' ORDER BY table_name, column_name")
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
        {"request_id": "r0", "prompt": "a red cube", "reward": 0.5, "status": "done"}]
    assert rows(ledger, "SELECT iteration, score FROM validation") == [{"iteration": 0, "score": 0.42}]
    assert rows(ledger, "SELECT criterion, score FROM validation_scores ORDER BY criterion") == [
        {"criterion": "color", "score": 0.75}, {"criterion": "counting", "score": 0.25}]
    assert rows(ledger, "SELECT usd_total FROM cost_per_iteration")[0]["usd_total"] == pytest.approx(1.0)
    assert rows(ledger, "SELECT version, kind, replica, patch_bytes, weights_hash FROM syncs") == [
        {"version": 1, "kind": "patch", "replica": 0, "patch_bytes": 120, "weights_hash": "abc"}]
    assert rows(ledger, "SELECT arm, rank_consistency, kendall_tau FROM exploration") == [
        {"arm": "m8-none", "rank_consistency": 0.8, "kendall_tau": None}]
    assert _schema(ledger) == _schema(Ledger.in_memory())  # migrated == freshly created


def test_a_ledger_from_a_newer_spotlight_is_refused_with_the_reason(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger(path).query("INSERT INTO schema_version VALUES (99, '2030-01-01', 'future')")
    with pytest.raises(LedgerSchemaError, match=r"schema v99, newer than this spotlight understands \(v2\)"):
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
    from resources.ledger_records import RequestRecord
    ledger = Ledger(sys.argv[1])
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[2])
    i = 0
    while time.monotonic() < end:
        ledger.record_request(RequestRecord(f"r-{i}", 0, "rollout", "p", i, 0, "w", 1, reward=0.5))
        i += 1
    print(i, flush=True)
""")


def test_a_reader_works_while_a_writer_is_recording(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), "3"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        seen = []
        for _ in range(8):
            seen.append(query_ledger(path, "SELECT count(*) FROM requests", timeout_s=10).rows[0][0])
            time.sleep(0.1)
        written = int(writer.communicate(timeout=60)[0].strip())
    finally:
        writer.kill()
    assert seen == sorted(seen) and seen[0] < seen[-1] <= written  # reads interleaved with writes
    assert query_ledger(path, "SELECT count(*) FROM requests").rows[0][0] == written


def test_a_ledger_held_open_elsewhere_gives_a_clear_locked_message(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger(path)
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import duckdb, time; c = duckdb.connect({str(path)!r}); print('held', flush=True); time.sleep(20)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LedgerLockedError, match=r"stayed locked for 0.5 s by another process .*PID"):
            query_ledger(path, "SELECT 1", timeout_s=0.5)
    finally:
        holder.kill()
        holder.wait()


def test_read_only_queries_cannot_change_the_ledger_or_touch_files(tmp_path: Path) -> None:
    path = tmp_path / "ledger.duckdb"
    Ledger(path)
    with pytest.raises(duckdb.Error, match="read-only"):
        query_ledger(path, "DELETE FROM runs")
    with pytest.raises(duckdb.Error, match="disabled by configuration"):
        query_ledger(path, f"COPY runs TO '{tmp_path / 'leak.csv'}'")


# --- credentials ------------------------------------------------------------------------


def test_no_credentials_are_ever_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    path = tmp_path / "ledger.duckdb"
    ledger = Ledger(path)
    fill_two_iterations(ledger)
    ledger.start_run("demo", store_url="s3://bucket/prefix", queue_url="redis://127.0.0.1:6379/0", config={"store": "s3://bucket/prefix"})
    with pytest.raises(ValueError, match="credential"):
        ledger.start_run("demo", config={"redis": {"password": "hunter2"}})
    with pytest.raises(ValueError, match="must not carry credentials"):
        ledger.start_run("demo", queue_url="redis://:hunter2@host:6379")
    dump = json.dumps([ledger.query(f"SELECT * FROM {t}").rows for (t,) in ledger.query("SHOW TABLES").rows], default=str)
    raw = path.read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("ledger.duckdb*") if p != path)
    for value in (secret, "AKIAIOSFODNN7EXAMPLE", "hunter2"):
        assert value not in dump and value.encode() not in raw


# --- docs/LEDGER.md ---------------------------------------------------------------------


def test_every_query_in_the_ledger_docs_runs_as_written(filled: Ledger) -> None:
    text = (REPO / "docs" / "LEDGER.md").read_text()
    queries = re.findall(r"```sql\n(.*?)```", text, flags=re.DOTALL)
    assert len(queries) >= 4
    for sql in queries:
        result = filled.query(sql)
        assert result.rows, f"query returned no rows on the example ledger:\n{sql}"


def test_cli_ledger_command_prints_json_and_csv(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    path = tmp_path / "ledger.duckdb"
    fill_two_iterations(Ledger(path))
    sql = "SELECT iteration, round(usd_total, 4) AS usd FROM cost_per_iteration ORDER BY iteration"
    as_json = CliRunner().invoke(app, ["ledger", sql, "--db", str(path), "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert [json.loads(line) for line in as_json.output.splitlines()] == [
        {"iteration": 0, "usd": 5.8333}, {"iteration": 1, "usd": 5.5}]
    as_csv = CliRunner().invoke(app, ["ledger", sql, "--db", str(path), "--csv"])
    assert as_csv.output.splitlines() == ["iteration,usd", "0,5.8333", "1,5.5"]
    table = CliRunner().invoke(app, ["ledger", sql, "--db", str(path)])
    assert table.exit_code == 0 and "5.8333" in table.output
    bad = CliRunner().invoke(app, ["ledger", "SELECT nope FROM runs", "--db", str(path)])
    assert bad.exit_code != 0 and "nope" in bad.output


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
    code = ("import sys, resources.store, resources.store_local, resources.store_s3, resources.ledger, "
            "resources.ledger_db, resources.prices, resources.keys; "
            "print(sorted(m for m in ('dagster', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
