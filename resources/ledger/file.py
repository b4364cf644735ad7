"""One ledger file's mechanics: the connection, the row buffer and its flushes, typed upserts (`LedgerFile`).

`Ledger` (resources/ledger/__init__.py) adds the typed `record_*` methods on top; the module docstring there says
when buffered rows reach the file.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import threading
import weakref
from pathlib import Path
from typing import Any, Iterator, Self, Sequence

import duckdb

from resources.ledger.db import QueryResult, RowBuffer, connect, fetch, insert_rows, table_layouts, transaction
from resources.ledger.records import to_utc
from resources.ledger.schema import upgrade
from resources.prices import PriceTable, load_prices

_ALWAYS_STAMPED = {"preempted_at", "started_at", "recorded_at"}  # NOT NULL times: None means now


class LedgerFile:
    """A run's DuckDB ledger file (or ':memory:'), its schema brought up to date on open, written through a buffer."""

    def __init__(
        self,
        path: str | Path,
        *,
        prices: PriceTable | None = None,
        prices_path: str | Path | None = None,
        lock_timeout_s: float = 30.0,
        flush_rows: int = 20_000,
        flush_s: float = 2.0,
    ) -> None:
        if flush_rows < 1 or not flush_s >= 0:
            raise ValueError(f"flush_rows must be >= 1 and flush_s >= 0, got {flush_rows} and {flush_s}")
        self.prices = prices or load_prices(prices_path)
        self.lock_timeout_s = lock_timeout_s
        self.flush_rows, self.flush_s = flush_rows, flush_s
        self._memory: duckdb.DuckDBPyConnection | None = None
        self._buffer = RowBuffer()
        self._open_phases: set[tuple[int, str]] = set()
        self._batches = 0
        self._held: duckdb.DuckDBPyConnection | None = None  # the connection of a `held()` block
        self._lock = threading.RLock()  # the buffer and the file, should a thread record too
        if str(path) == ":memory:":
            self.path = None
            self._memory = duckdb.connect(":memory:")
            self._memory.execute("SET TimeZone = 'UTC'")
        else:
            self.path = Path(path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connection() as con:
            # Schema version found on open: -1 for a new file, < SCHEMA_VERSION if migrated.
            self.upgraded_from = upgrade(con, str(self.path or ":memory:"))
            self._layouts = table_layouts(con)
        _OPEN_LEDGERS.add(self)

    @classmethod
    def in_memory(cls, prices: PriceTable | None = None) -> Self:
        """A ledger that lives only as long as this object (tests, dry runs)."""
        return cls(":memory:", prices=prices)

    def close(self) -> None:
        """Write the buffered rows, then release the in-memory database (a file is held open only in `held()`)."""
        self.flush()
        if self._memory is not None:
            self._memory.close()
            self._memory = None

    def flush(self) -> None:
        """Write every buffered row now (one short connection)."""
        with self._lock:
            if self._buffer.num_rows:
                with self._connection():
                    pass  # _connection writes the buffer first

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Buffer records inside the block (as inside a phase); they are written when it exits."""
        with self._lock:
            self._batches += 1
        try:
            yield
        finally:
            with self._lock:
                self._batches -= 1
            self.flush()

    @property
    def buffered_rows(self) -> int:
        """Rows recorded but not yet in the file."""
        return self._buffer.num_rows

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """One connection for every read and write inside the block (a report's few dozen queries), where each
        would otherwise open the file anew: opening it costs about 25 ms of CPU (DuckDB builds its catalog),
        which short runs paid hundreds of times. Other processes wait for the file until the block ends, so a
        block holds no sampling or training, only ledger work and what it draws. Nested blocks share the outer
        one's connection; other threads of this process use it too, one at a time."""
        with self._lock:
            opens = self.path is not None and self._held is None  # not in memory, not nested
            if opens:
                self._held = connect(self.path, read_only=False, timeout_s=self.lock_timeout_s)
        try:
            yield
        finally:
            if opens:
                with self._lock:
                    con, self._held = self._held, None
                    if con is not None:
                        con.close()  # release the file so readers in other processes get their turn

    @contextlib.contextmanager
    def _connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-write connection with the buffered rows already written (so reads see every record)."""
        with self._lock:
            if self.path is None:
                if self._memory is None:
                    raise ValueError("this in-memory ledger is closed")
                self._write_buffer(self._memory)
                yield self._memory
                return
            if self._held is not None:
                self._write_buffer(self._held)
                yield self._held
                return
            con = connect(self.path, read_only=False, timeout_s=self.lock_timeout_s)
            try:
                self._write_buffer(con)
                yield con
            finally:
                con.close()  # release the file so readers in other processes get their turn

    def _write_buffer(self, con: duckdb.DuckDBPyConnection) -> None:
        if not self._buffer.num_rows:
            return
        groups = self._buffer.take()  # taken even on failure: a bad row must not block every later write
        try:
            with transaction(con):
                for table, names, rows in groups:
                    insert_rows(con, table, names, rows, self._layouts[table])
        except duckdb.Error as err:
            lost = sum(len(rows) for _, _, rows in groups)
            raise ValueError(
                f"ledger: {lost} buffered rows of {sorted({g[0] for g in groups})} were refused: {err}"
            ) from err

    # --- reading -------------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] | None = None) -> QueryResult:
        """Run SQL on this ledger (read-write connection; use `query_ledger` from other processes)."""
        with self._connection() as con:
            return fetch(con, sql, params)

    # --- writing -----------------------------------------------------------------------

    def _upsert(self, table: str, records: list[Any]) -> None:
        if not records:
            return
        names, stamps = _record_columns(type(records[0]))
        self._record_rows(
            table,
            names,
            [[_column_value(stamp, getattr(r, n)) for n, stamp in zip(names, stamps, strict=False)] for r in records],
        )

    def _record_rows(self, table: str, names: tuple[str, ...], rows: list[list[Any]]) -> None:
        """INSERT OR REPLACE rows: buffered while a phase or batch is open, else written now."""
        with self._lock:
            self._buffer.add(table, names, rows)
            if self._batches or self._open_phases:
                if self._buffer.due(self.flush_rows, self.flush_s):
                    self.flush()
            else:
                self.flush()

    def _update_one(self, table: str, key_column: str, key: Any, **values: Any) -> None:
        assignments = ", ".join(f"{name} = ?" for name in values)
        with self._connection() as con:
            count = con.execute(
                f"UPDATE {table} SET {assignments} WHERE {key_column} = ?", [*values.values(), key]
            ).fetchone()[0]
        if count == 0:
            raise ValueError(f"cannot end {table[:-1]} {key!r}: it was never started in this ledger")


_OPEN_LEDGERS: "weakref.WeakSet[LedgerFile]" = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    """A process that forgot `close()` still writes its buffered rows when it exits normally."""
    for ledger in list(_OPEN_LEDGERS):
        if ledger.path is not None or ledger._memory is not None:
            ledger.flush()


@functools.lru_cache(maxsize=None)
def _record_columns(record_type: type) -> tuple[tuple[str, ...], tuple[str | None, ...]]:
    """Column names of a record type, and per column how its value is stamped: 'always', 'given' or None."""
    names = tuple(f.name for f in dataclasses.fields(record_type))
    stamps = tuple("always" if n in _ALWAYS_STAMPED else "given" if n.endswith("_at") else None for n in names)
    return names, stamps


def _column_value(stamp: str | None, value: Any) -> Any:
    if stamp == "always" or (stamp == "given" and value is not None):
        return to_utc(value)
    return value
