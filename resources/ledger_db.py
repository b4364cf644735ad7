"""Opening a ledger file: short-lived connections, retry while another process holds the lock.

DuckDB lets one process at a time open a database file for writing, and a writer also
blocks readers in other processes. The ledger therefore never keeps a file connection
open: the writer connects for each record (about 25 ms) and readers connect read-only
for each query; both retry with backoff while the other holds the file, and give up
with `LedgerLockedError` (naming the holder) after a timeout.
"""

from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

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
        return [dict(zip(self.columns, row)) for row in self.rows]


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
                    "spotlight writers hold it only for single records, so a process is keeping it open "
                    "(a DuckDB shell or notebook?). Close that connection, or copy the file and query the copy."
                ) from err
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.25)
            continue
        con.execute("SET TimeZone = 'UTC'")  # show the stored UTC times as UTC
        if read_only:
            con.execute("SET lock_configuration = true")  # user SQL cannot undo the restrictions
        return con


def query_ledger(path: str | Path, sql: str, params: Sequence[Any] | None = None, *, timeout_s: float = 30.0) -> QueryResult:
    """Run SQL read-only against a ledger file (works while a run is writing it).

    The connection is read-only with file access disabled, so a query can neither change
    the ledger nor read or write other files (COPY, ATTACH, read_csv are refused).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no ledger at {path}: pass --db PATH (a run's {LEDGER_FILENAME}) or set SPOTLIGHT_LEDGER")
    con = connect(path, read_only=True, timeout_s=timeout_s)
    try:
        cursor = con.execute(sql, params or [])
        columns = [d[0] for d in cursor.description or []]
        rows = cursor.fetchall() if columns else []
    except duckdb.Error as err:
        raise LedgerQueryError(str(err)) from err
    finally:
        con.close()
    return QueryResult(columns, rows)


def find_ledger(db: str | Path | None = None, search_root: Path = Path("runs")) -> Path:
    """The ledger to query: `db`, else $SPOTLIGHT_LEDGER, else the newest runs/*/ledger.duckdb."""
    if db:
        return Path(db)
    if os.environ.get("SPOTLIGHT_LEDGER"):
        return Path(os.environ["SPOTLIGHT_LEDGER"])
    candidates = sorted(search_root.glob(f"*/{LEDGER_FILENAME}"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        raise FileNotFoundError(
            f"no ledger found: pass --db PATH, set SPOTLIGHT_LEDGER, or run from a folder with {search_root}/*/{LEDGER_FILENAME}"
        )
    return candidates[-1]
