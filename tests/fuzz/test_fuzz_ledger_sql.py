"""Fuzzing the ledger's read-only SQL gate (`spotlight ledger "SQL"`): only LedgerQueryError comes out,
the ledger file stays byte-identical, and no other file appears."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from resources.ledger import Ledger
from resources.ledger.db import LedgerQueryError, query_ledger
from resources.ledger.records import RequestRecord
from tests.fuzz.fuzzing import FUZZ, count_input

REFUSED = [  # writes, files, extensions, settings, secrets, the environment: each must be refused
    "DROP TABLE requests",
    "DELETE FROM requests",
    "UPDATE runs SET status = 'x'",
    "INSERT INTO runs VALUES (1)",
    "CREATE TABLE x (a INT)",
    "ATTACH '{dir}/other.duckdb' AS o",
    "COPY requests TO '{dir}/out.csv'",
    "COPY (SELECT 1) TO '{dir}/out.parquet' (FORMAT parquet)",
    "EXPORT DATABASE '{dir}/export'",
    "SELECT * FROM read_csv('/etc/passwd')",
    "SELECT * FROM read_text('/etc/hostname')",
    "INSTALL httpfs",
    "LOAD httpfs",
    "SET enable_external_access = true",
    "SET lock_configuration = false",
    "RESET lock_configuration",
    "PRAGMA enable_profiling",
    "SET profiling_output = '{dir}/p.json'",
    "DETACH memory",
    "CREATE SECRET s (TYPE s3)",
    "SELECT getenv('HOME')",
    "SELECT * FROM glob('/*')",
    "BEGIN; DROP TABLE runs; COMMIT",
    "SELECT 1; DROP TABLE runs",
    "USE memory; CREATE TABLE t (a INT)",
    "",
    ";",
]
ATTACKS = REFUSED + [  # odd values and no-ops: answered or refused, never a crash
    "CHECKPOINT",
    "VACUUM",
    "CALL pragma_version()",
    "SELECT DATE '294247-01-10'",
    "SELECT 'infinity'::TIMESTAMP",
    "SELECT -'infinity'::DATE",
    "SELECT 1e308 * 10",
    "SELECT 9223372036854775807 + 1",
    "SELECT 170141183460469231731687303715884105727::HUGEINT",
    "SELECT '\\x00'::BLOB",
    "SELECT repeat('a', 1000000)",
    "SELECT list_value(1, 2, 3)",
    "SELECT {'a': 1}",
    "SELECT map([1], [2])",
    "SELECT 1::UUID",
    "SELECT 'x'::INTERVAL",
    "SELECT TIMESTAMPTZ '2020-01-01 00:00:00+05'",
    "SELECT * FROM requests",
    "SELECT * FROM cost_per_iteration",
    "--",
    "/*",
    "SELECT",
    "\x00",
    "SELECT '\udcff'",
]
TOKENS = [
    "SELECT",
    "FROM",
    "WHERE",
    "requests",
    "runs",
    "*",
    "1",
    "'a'",
    "(",
    ")",
    ",",
    ";",
    "DROP",
    "TABLE",
    "COPY",
    "TO",
    "ATTACH",
    "INSERT",
    "INTO",
    "VALUES",
    "UNION",
    "ALL",
    "::",
    "DATE",
    "TIMESTAMP",
    "NULL",
    "read_csv",
    "'/etc'",
    "--",
]


@pytest.fixture(scope="module")
def ledger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ledger")
    with Ledger(folder / "ledger.duckdb") as ledger:
        ledger.start_run("demo", preset="cpu_tiny")
        ledger.record_requests([RequestRecord(f"r{i}", 0, "rollout", "p", i, 0, "w", 1, reward=0.5) for i in range(10)])
    return folder


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


sql_texts = (
    st.sampled_from(ATTACKS)
    | st.lists(st.sampled_from(TOKENS), max_size=12).map(" ".join)
    | st.text(max_size=60)
    | st.builds(lambda a, b: f"{a}; {b}", st.sampled_from(ATTACKS), st.sampled_from(ATTACKS))
)


@FUZZ
@given(sql_texts)
def test_any_sql_is_answered_or_refused_and_changes_nothing(ledger_dir: Path, sql: str) -> None:
    count_input("ledger_sql")
    before = _digest(ledger_dir)
    try:
        result = query_ledger(ledger_dir / "ledger.duckdb", sql.replace("{dir}", str(ledger_dir)), timeout_s=10)
    except LedgerQueryError:
        pass
    else:
        assert all(len(row) == len(result.columns) for row in result.rows)
    assert _digest(ledger_dir) == before


@pytest.mark.parametrize("sql", ATTACKS)
def test_every_known_attack_is_answered_or_refused_and_changes_nothing(ledger_dir: Path, sql: str) -> None:
    test_any_sql_is_answered_or_refused_and_changes_nothing.hypothesis.inner_test(ledger_dir, sql)


@pytest.mark.parametrize("sql", REFUSED)
def test_every_write_file_access_or_setting_is_refused(ledger_dir: Path, sql: str) -> None:
    before = _digest(ledger_dir)
    with pytest.raises(LedgerQueryError):
        query_ledger(ledger_dir / "ledger.duckdb", sql.replace("{dir}", str(ledger_dir)), timeout_s=10)
    assert _digest(ledger_dir) == before


def test_a_select_is_answered_with_the_ledgers_rows(ledger_dir: Path) -> None:
    result = query_ledger(
        ledger_dir / "ledger.duckdb", "SELECT request_id, reward FROM requests ORDER BY 1", timeout_s=10
    )
    assert result.rows == [(f"r{i}", 0.5) for i in range(10)]
