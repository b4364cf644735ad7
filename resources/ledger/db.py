"""Opening a ledger file: short-lived connections, retry while another process holds the lock, bulk writes.

DuckDB lets one process at a time open a database file for writing, and a writer also
blocks readers in other processes. The ledger therefore never keeps a file connection
open: the writer connects (about 25 ms) for each write and readers connect read-only for
each query; both retry with backoff while the other holds the file, and give up with
`LedgerLockedError` (naming the holder) after a timeout.

Connecting per record would cap the writer near 40 records/s, so rows recorded while a
phase is open are buffered (`RowBuffer`) and written together by `insert_rows`, one
column-wise INSERT per table (tens of thousands of rows per second) inside one short
connection; see `Ledger` for when the buffer is written and what a crash can lose.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import duckdb

LEDGER_FILENAME = "ledger.duckdb"
_RETRYABLE = ("could not set lock", "conflicting lock", "different configuration")


class LedgerLockedError(RuntimeError):
    """Another process held the ledger file for longer than the timeout."""


class LedgerQueryError(ValueError):
    """The SQL was refused or failed (a syntax error, an unknown table, a write on the read-only ledger)."""


@dataclass(frozen=True)
class QueryResult:
    """Columns and rows of one query."""

    columns: list[str]
    """Column names in order."""
    rows: list[tuple[Any, ...]]
    """Row tuples."""

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=False)) for row in self.rows]


def connect(path: Path, *, read_only: bool, timeout_s: float) -> duckdb.DuckDBPyConnection:
    """Connect to a ledger file, retrying while another process holds its lock."""
    config = {"enable_external_access": False} if read_only else {}
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            con = duckdb.connect(str(path), read_only=read_only, config=config)
        except (duckdb.IOException, duckdb.ConnectionException) as err:
            message = str(err)
            if not any(marker in message.lower() for marker in _RETRYABLE):
                raise
            if time.monotonic() >= deadline:
                holder = message.split("Conflicting lock is held in", 1)[-1].split(". See", 1)[0].strip()
                raise LedgerLockedError(
                    f"ledger {path} stayed locked for {timeout_s:g} s by another process ({holder}). "
                    "spotlight writers hold it for a write or a report's few seconds, so a process is keeping it open "
                    "(a DuckDB shell or notebook?). Close that connection, or copy the file and query the copy."
                ) from err
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.25)
            continue
        con.execute("SET TimeZone = 'UTC'")  # show the stored UTC times as UTC
        if read_only:
            con.execute("SET lock_configuration = true")  # user SQL cannot undo the restrictions
        return con


def query_ledger(
    path: str | Path, sql: str, params: Sequence[Any] | None = None, *, timeout_s: float = 30.0
) -> QueryResult:
    """Run SQL read-only against a ledger file (works while a run is writing it).

    The connection is read-only with file access disabled, so a query can neither change
    the ledger nor read or write other files (COPY, ATTACH, read_csv are refused).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no ledger at {path}: pass --db PATH (a run's {LEDGER_FILENAME}) or set SPOTLIGHT_LEDGER"
        )
    if not isinstance(sql, str) or not sql.strip(" \t\r\n;"):
        raise LedgerQueryError(f'no SQL to run (got {sql!r:.40}): pass a query such as "SELECT * FROM run_cost"')
    con = connect(path, read_only=True, timeout_s=timeout_s)
    try:
        return fetch(con, sql, params)
    # ValueError / OverflowError: a value Python cannot hold (a date past year 9999, an odd encoding).
    except (duckdb.Error, ValueError, OverflowError) as err:
        raise LedgerQueryError(str(err)) from err
    finally:
        con.close()


def fetch(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None) -> QueryResult:
    """Run one query and take every row (a statement with no result, such as a comment alone, has none)."""
    cursor = con.execute(sql, params or [])
    columns = [d[0] for d in (cursor.description if cursor is not None else None) or []]
    return QueryResult(columns, cursor.fetchall() if columns else [])


def find_ledger(db: str | Path | None = None, search_root: Path = Path("runs")) -> Path:
    """The ledger to query: `db`, else $SPOTLIGHT_LEDGER, else the newest runs/*/ledger.duckdb."""
    if db:
        return Path(db)
    if os.environ.get("SPOTLIGHT_LEDGER"):
        return Path(os.environ["SPOTLIGHT_LEDGER"])
    candidates = sorted(search_root.glob(f"*/{LEDGER_FILENAME}"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise FileNotFoundError(
            "no ledger found: pass --db PATH, set SPOTLIGHT_LEDGER, or run from a folder with "
            f"{search_root}/*/{LEDGER_FILENAME}"
        )
    return candidates[-1]


@dataclass(frozen=True)
class TableLayout:
    """What a bulk insert needs to know about one table."""

    key_columns: tuple[str, ...]
    """Primary-key columns (a batch keeps the last row per key, as one-by-one upserts would)."""
    column_types: dict[str, str]
    """Column name -> DuckDB type name."""


def table_layouts(con: duckdb.DuckDBPyConnection) -> dict[str, TableLayout]:
    """Primary keys and column types of every table of an open ledger."""
    keys = {
        table: tuple(columns)
        for table, columns in con.execute(
            "SELECT table_name, constraint_column_names FROM duckdb_constraints() "
            "WHERE constraint_type = 'PRIMARY KEY' AND database_name = current_database()"
        ).fetchall()
    }
    types: dict[str, dict[str, str]] = {}
    for table, column, kind in con.execute(
        "SELECT table_name, column_name, data_type FROM information_schema.columns "
        "WHERE table_schema = 'main' AND table_catalog = current_database()"
    ).fetchall():
        types.setdefault(table, {})[column] = kind
    return {table: TableLayout(keys.get(table, ()), columns) for table, columns in types.items()}


def insert_rows(
    con: duckdb.DuckDBPyConnection, table: str, names: Sequence[str], rows: list[list[Any]], layout: TableLayout
) -> None:
    """INSERT OR REPLACE many rows at once: one list parameter per column, unnested side by side.

    DuckDB's executemany runs one statement per row (about 200 rows/s); this is one statement.
    """
    if layout.key_columns:  # one statement may not replace the same key twice: keep the last row
        key_at = [names.index(k) for k in layout.key_columns]
        rows = list({tuple(row[i] for i in key_at): row for row in rows}.values())
    columns = [list(values) for values in zip(*rows, strict=False)]
    unnest = ", ".join(f"unnest(?::{layout.column_types[n]}[])" for n in names)
    con.execute(f"INSERT OR REPLACE INTO {table} ({', '.join(names)}) SELECT {unnest}", columns)


@dataclass
class RowBuffer:
    """Rows recorded but not yet written, in recording order, grouped by runs of one table."""

    groups: list[tuple[str, tuple[str, ...], list[list[Any]]]] = field(default_factory=list)
    num_rows: int = 0
    first_at: float | None = None
    """time.monotonic() of the oldest buffered row."""

    def add(self, table: str, names: tuple[str, ...], rows: list[list[Any]]) -> None:
        if self.groups and self.groups[-1][:2] == (table, names):
            self.groups[-1][2].extend(rows)
        else:
            self.groups.append((table, names, list(rows)))
        self.num_rows += len(rows)
        if self.first_at is None:
            self.first_at = time.monotonic()

    def due(self, max_rows: int, max_age_s: float) -> bool:
        """True when the buffer holds `max_rows` rows or its oldest row is `max_age_s` old."""
        return self.num_rows >= max_rows or (
            self.first_at is not None and time.monotonic() - self.first_at >= max_age_s
        )

    def take(self) -> list[tuple[str, tuple[str, ...], list[list[Any]]]]:
        groups, self.groups, self.num_rows, self.first_at = self.groups, [], 0, None
        return groups


@contextlib.contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")
