"""The run ledger: a DuckDB file per run that records what happened and what it cost.

One process writes it (the coordinator) through the typed `record_*` methods below;
anyone can query it meanwhile with `spotlight ledger "SQL"` (see `ledger_db.py` for
how reading and writing share the file, `ledger_schema.py` for the tables and views,
docs/LEDGER.md for example queries).

Durability: rows of `start_worker` and of the `record_*` methods for requests, attempts,
preemptions, syncs, exploration and train steps that arrive while a phase is open (between `record_phase`'s
start and end, or inside `phase()` / `batch()`) are buffered in memory and written
together. The buffer reaches the file when the phase ends, before any other write or any
`query`, once it holds `flush_rows` rows, at the first record `flush_s` seconds after its
oldest row, on `flush()` / `close()`, and at normal interpreter exit. A process killed
inside a phase loses at most that phase's rows of the last `flush_s` seconds (or
`flush_rows` rows); the phase then stays without an end in the ledger, and a resumed
iteration records it afresh. Outside a phase every record is written at once.

Example:
    ledger = Ledger("runs/demo/ledger.duckdb")
    ledger.start_run("demo", preset="cpu_tiny", config=asdict(cfg), store_url=store.url)
    ledger.start_worker("w0", role="rollout", instance_type="local", gpu_type="H100", spot=True)
    ledger.start_iteration(0, weights_version=0)
    with ledger.phase(0, "rollout"):
        ...
    ledger.record_requests(records)
    ledger.end_iteration(0)
    print(ledger.query("SELECT * FROM cost_per_iteration").as_dicts())
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import json
import threading
import weakref
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

import duckdb

from resources.ledger.db import QueryResult, RowBuffer, connect, fetch, insert_rows, table_layouts, transaction
from resources.ledger.hacking import HackingRecords
from resources.ledger.records import (
    WORKER_END_REASONS,
    WORKER_ROLES,
    AttemptRecord,
    ExplorationRecord,
    PreemptionRecord,
    RequestRecord,
    SyncRecord,
    Timestamp,
    TrainStepRecord,
    check_choice,
    reject_config_secrets,
    reject_url_secrets,
    to_utc,
    union_seconds,
)
from resources.ledger.schema import PHASES, upgrade
from resources.prices import PriceTable, load_prices

_RUN_STATUSES = ("running", "succeeded", "failed", "interrupted")
_ALWAYS_STAMPED = {"preempted_at", "started_at", "recorded_at"}  # NOT NULL times: None means now
_WORKER_COLUMNS = (
    "worker_id",
    "role",
    "instance_type",
    "gpu_type",
    "num_gpus",
    "spot",
    "usd_per_hour",
    "price_source",
    "started_at",
    "ended_at",
    "end_reason",
)


class Ledger(HackingRecords):
    """Typed writer (and convenience reader) of one run's ledger file, or ':memory:'."""

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
    def in_memory(cls, prices: PriceTable | None = None) -> "Ledger":
        """A ledger that lives only as long as this object (tests, dry runs)."""
        return cls(":memory:", prices=prices)

    def close(self) -> None:
        """Write the buffered rows, then release the in-memory database (a file is never held open)."""
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

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    # --- runs, iterations, phases --------------------------------------------------------

    def start_run(
        self,
        run_id: str,
        *,
        preset: str | None = None,
        config: Mapping[str, Any] | None = None,
        store_url: str | None = None,
        queue_url: str | None = None,
        at: Timestamp = None,
    ) -> None:
        """Record a run start; calling it again on resume keeps the first start time."""
        for url in (store_url, queue_url):
            reject_url_secrets(url)
        reject_config_secrets(config or {}, "config")
        with self._connection() as con:
            con.execute(
                "INSERT INTO runs VALUES (?, ?, NULL, 'running', ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET "
                "ended_at = NULL, status = 'running', preset = excluded.preset, store_url = excluded.store_url, "
                "queue_url = excluded.queue_url, config = excluded.config, price_table = excluded.price_table",
                [
                    run_id,
                    to_utc(at),
                    preset,
                    store_url,
                    queue_url,
                    json.dumps(dict(config or {}), sort_keys=True, default=str),
                    json.dumps(self.prices.as_json()),
                ],
            )

    def end_run(self, run_id: str, *, status: str = "succeeded", at: Timestamp = None) -> None:
        """Record how and when a run ended."""
        check_choice(status, _RUN_STATUSES, "run status")
        self._update_one("runs", "run_id", run_id, ended_at=to_utc(at), status=status)

    def start_iteration(self, iteration: int, *, weights_version: int | None = None, at: Timestamp = None) -> None:
        """Record an iteration start (a resumed iteration starts afresh)."""
        with self._connection() as con:
            con.execute(
                "INSERT OR REPLACE INTO iterations VALUES (?, ?, ?, NULL, NULL, 'running')",
                [iteration, weights_version, to_utc(at)],
            )

    def end_iteration(
        self, iteration: int, *, status: str = "succeeded", critical_path_s: float | None = None, at: Timestamp = None
    ) -> None:
        """Record an iteration end; critical path defaults to the union of its phase intervals."""
        check_choice(status, _RUN_STATUSES[1:], "iteration status")
        ended = to_utc(at)
        if critical_path_s is None:
            rows = self.query(
                "SELECT started_at, coalesce(ended_at, ?) FROM phases WHERE iteration = ? ORDER BY started_at",
                [ended, iteration],
            ).rows
            critical_path_s = union_seconds(rows)
        self._update_one(
            "iterations", "iteration", iteration, ended_at=ended, status=status, critical_path_s=critical_path_s
        )

    def record_phase(self, iteration: int, phase: str, started_at: Timestamp, ended_at: Timestamp = None) -> None:
        """Record (or complete) one phase window; `ended_at=None` marks it running."""
        check_choice(phase, PHASES, "phase")
        with self._connection() as con:  # a phase end writes the rows buffered during the phase
            con.execute(
                "INSERT OR REPLACE INTO phases VALUES (?, ?, ?, ?)",
                [iteration, phase, to_utc(started_at), None if ended_at is None else to_utc(ended_at)],
            )
            if ended_at is None:
                self._open_phases.add((iteration, phase))
            else:
                self._open_phases.discard((iteration, phase))

    @contextlib.contextmanager
    def phase(self, iteration: int, phase: str) -> Iterator[None]:
        """Record a phase around a block: start now, end when the block exits (also on error)."""
        start = to_utc(None)
        self.record_phase(iteration, phase, start)
        try:
            yield
        finally:
            self.record_phase(iteration, phase, start, to_utc(None))

    # --- workers -------------------------------------------------------------------------

    def start_worker(
        self,
        worker_id: str,
        *,
        role: str,
        instance_type: str,
        spot: bool,
        gpu_type: str | None = None,
        num_gpus: int = 1,
        usd_per_hour: float | None = None,
        at: Timestamp = None,
    ) -> float:
        """Record a worker start with its price (from the price table unless given); return $/hour."""
        check_choice(role, WORKER_ROLES, "worker role")
        if usd_per_hour is None:
            if gpu_type is None:
                raise ValueError(f"worker {worker_id!r}: give gpu_type (priced from the table) or usd_per_hour")
            usd_per_hour, source = self.prices.usd_per_hour(gpu_type, spot=spot, num_gpus=num_gpus)
        else:
            if not usd_per_hour >= 0:
                raise ValueError(f"worker {worker_id!r}: usd_per_hour must be >= 0, got {usd_per_hour}")
            source = "given by the caller"
        self._record_rows(
            "workers",
            _WORKER_COLUMNS,
            [[worker_id, role, instance_type, gpu_type, num_gpus, spot, usd_per_hour, source, to_utc(at), None, None]],
        )
        return usd_per_hour

    def end_worker(self, worker_id: str, *, reason: str, at: Timestamp = None) -> None:
        """Record a worker's end: finished, preempted, failed, scaled_down or interrupted."""
        check_choice(reason, WORKER_END_REASONS, "worker end reason")
        self._update_one("workers", "worker_id", worker_id, ended_at=to_utc(at), end_reason=reason)

    # --- work and results ----------------------------------------------------------------

    def record_request(self, record: RequestRecord) -> None:
        self.record_requests([record])

    def record_requests(self, records: Iterable[RequestRecord]) -> None:
        """Record finished requests in one transaction (re-recording an id replaces it)."""
        self._upsert("requests", list(records))

    def record_attempt(self, record: AttemptRecord) -> None:
        self._upsert("attempts", [record])

    def record_preemption(self, record: PreemptionRecord) -> None:
        self._upsert("preemptions", [record])

    def record_sync(self, record: SyncRecord) -> None:
        self._upsert("syncs", [record])

    def record_exploration(self, record: ExplorationRecord) -> None:
        self._upsert("exploration", [record])

    def record_seed_groups(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Rows of `seed_groups` (column -> value; absent nullable columns are NULL); a redone iteration replaces its rows."""
        rows, names = list(rows), tuple(self._layouts["seed_groups"].column_types)
        unknown = sorted({key for row in rows for key in row} - set(names))
        if unknown:
            raise ValueError(f"seed_groups has no columns {unknown}; its columns are {list(names)}")
        if rows:
            self._record_rows("seed_groups", names, [[row.get(n) for n in names] for row in rows])

    def record_train_step(self, record: TrainStepRecord) -> None:
        self._upsert("train_steps", [record])

    def record_train_steps(self, records: Iterable[TrainStepRecord]) -> None:
        self._upsert("train_steps", list(records))

    def record_validation(
        self,
        iteration: int,
        *,
        weights_version: int,
        score: float,
        num_prompts: int,
        criteria: Mapping[str, float] | None = None,
        at: Timestamp = None,
        reward: str | None = None,
    ) -> None:
        """Record a held-out score, the reward spec that scored it and its breakdown (table `validation_scores`)."""
        if num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
        scores = [[iteration, str(name), float(value)] for name, value in sorted((criteria or {}).items())]
        with self._connection() as con, transaction(con):
            con.execute(
                "INSERT OR REPLACE INTO validation (iteration, weights_version, score, num_prompts, recorded_at, "
                "reward) VALUES (?, ?, ?, ?, ?, ?)",
                [iteration, weights_version, score, num_prompts, to_utc(at), reward],
            )
            con.execute("DELETE FROM validation_scores WHERE iteration = ?", [iteration])
            if scores:
                con.executemany("INSERT INTO validation_scores VALUES (?, ?, ?)", scores)

    # --- helpers -------------------------------------------------------------------------

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


_OPEN_LEDGERS: "weakref.WeakSet[Ledger]" = weakref.WeakSet()


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
