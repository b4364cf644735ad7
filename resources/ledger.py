"""The run ledger: a DuckDB file per run that records what happened and what it cost.

One process writes it (the coordinator) through the typed `record_*` methods below;
anyone can query it meanwhile with `spotlight ledger "SQL"` (see `ledger_db.py` for
how reading and writing share the file, `ledger_schema.py` for the tables and views,
docs/LEDGER.md for example queries).

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

import contextlib
import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence
from urllib.parse import urlparse

import duckdb

from resources.ledger_db import QueryResult, connect
from resources.ledger_records import (
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
    to_utc,
)
from resources.ledger_schema import PHASES, upgrade
from resources.prices import PriceTable, load_prices

_RUN_STATUSES = ("running", "succeeded", "failed", "interrupted")
_SECRET_KEY = re.compile(r"secret|password|passwd|token|credential|access_key|api_key", re.IGNORECASE)
_ALWAYS_STAMPED = {"preempted_at", "started_at"}  # NOT NULL times: None means now


class Ledger:
    """Typed writer (and convenience reader) of one run's ledger file, or ':memory:'."""

    def __init__(
        self,
        path: str | Path,
        *,
        prices: PriceTable | None = None,
        prices_path: str | Path | None = None,
        lock_timeout_s: float = 30.0,
    ) -> None:
        self.prices = prices or load_prices(prices_path)
        self.lock_timeout_s = lock_timeout_s
        self._memory: duckdb.DuckDBPyConnection | None = None
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

    @classmethod
    def in_memory(cls, prices: PriceTable | None = None) -> "Ledger":
        """A ledger that lives only as long as this object (tests, dry runs)."""
        return cls(":memory:", prices=prices)

    def close(self) -> None:
        if self._memory is not None:
            self._memory.close()
            self._memory = None

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _connection(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if self.path is None:
            if self._memory is None:
                raise ValueError("this in-memory ledger is closed")
            yield self._memory
            return
        con = connect(self.path, read_only=False, timeout_s=self.lock_timeout_s)
        try:
            yield con
        finally:
            con.close()  # release the file so readers in other processes get their turn

    # --- reading -------------------------------------------------------------------------

    def query(self, sql: str, params: Sequence[Any] | None = None) -> QueryResult:
        """Run SQL on this ledger (read-write connection; use `query_ledger` from other processes)."""
        with self._connection() as con:
            cursor = con.execute(sql, params or [])
            columns = [d[0] for d in cursor.description or []]
            return QueryResult(columns, cursor.fetchall() if columns else [])

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
            _reject_url_secrets(url)
        _reject_config_secrets(config or {}, "config")
        with self._connection() as con:
            con.execute(
                "INSERT INTO runs VALUES (?, ?, NULL, 'running', ?, ?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET "
                "ended_at = NULL, status = 'running', preset = excluded.preset, store_url = excluded.store_url, "
                "queue_url = excluded.queue_url, config = excluded.config, price_table = excluded.price_table",
                [run_id, to_utc(at), preset, store_url, queue_url,
                 json.dumps(dict(config or {}), sort_keys=True, default=str), json.dumps(self.prices.as_json())],
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
            critical_path_s = _union_seconds(rows)
        self._update_one("iterations", "iteration", iteration, ended_at=ended, status=status, critical_path_s=critical_path_s)

    def record_phase(self, iteration: int, phase: str, started_at: Timestamp, ended_at: Timestamp = None) -> None:
        """Record (or complete) one phase window; `ended_at=None` marks it running."""
        check_choice(phase, PHASES, "phase")
        with self._connection() as con:
            con.execute(
                "INSERT OR REPLACE INTO phases VALUES (?, ?, ?, ?)",
                [iteration, phase, to_utc(started_at), None if ended_at is None else to_utc(ended_at)],
            )

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
        with self._connection() as con:
            con.execute(
                "INSERT OR REPLACE INTO workers VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, NULL)",
                [worker_id, role, instance_type, gpu_type, num_gpus, spot, usd_per_hour, source, to_utc(at)],
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
    ) -> None:
        """Record a held-out score and its per-criterion breakdown (long table `validation_scores`)."""
        if num_prompts < 1:
            raise ValueError(f"num_prompts must be >= 1, got {num_prompts}")
        scores = [[iteration, str(name), float(value)] for name, value in sorted((criteria or {}).items())]
        with self._connection() as con, _transaction(con):
            con.execute("INSERT OR REPLACE INTO validation VALUES (?, ?, ?, ?, ?)", [iteration, weights_version, score, num_prompts, to_utc(at)])
            con.execute("DELETE FROM validation_scores WHERE iteration = ?", [iteration])
            if scores:
                con.executemany("INSERT INTO validation_scores VALUES (?, ?, ?)", scores)

    # --- helpers -------------------------------------------------------------------------

    def _upsert(self, table: str, records: list[Any]) -> None:
        if not records:
            return
        names = [f.name for f in dataclasses.fields(records[0])]
        rows = [[_column_value(n, getattr(r, n)) for n in names] for r in records]
        sql = f"INSERT OR REPLACE INTO {table} ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})"
        with self._connection() as con:
            con.executemany(sql, rows)

    def _update_one(self, table: str, key_column: str, key: Any, **values: Any) -> None:
        assignments = ", ".join(f"{name} = ?" for name in values)
        with self._connection() as con:
            count = con.execute(f"UPDATE {table} SET {assignments} WHERE {key_column} = ?", [*values.values(), key]).fetchone()[0]
        if count == 0:
            raise ValueError(f"cannot end {table[:-1]} {key!r}: it was never started in this ledger")


@contextlib.contextmanager
def _transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _column_value(name: str, value: Any) -> Any:
    if name in _ALWAYS_STAMPED or (name.endswith("_at") and value is not None):
        return to_utc(value)
    return value


def _union_seconds(intervals: Sequence[tuple[Any, Any]]) -> float:
    """Length of the union of [start, end) intervals sorted by start."""
    total, current_start, current_end = 0.0, None, None
    for start, end in intervals:
        if current_end is None or start > current_end:
            if current_end is not None:
                total += (current_end - current_start).total_seconds()
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += (current_end - current_start).total_seconds()
    return total


def _reject_url_secrets(url: str | None) -> None:
    if url and urlparse(url).password:
        raise ValueError("store/queue URLs recorded in the ledger must not carry credentials; configure them outside the URL")


def _reject_config_secrets(config: Mapping[str, Any], where: str) -> None:
    """The ledger is shared and copied around: refuse anything that looks like a credential."""
    for key, value in config.items():
        if _SECRET_KEY.search(str(key)) and value not in (None, "", False):
            raise ValueError(f"{where}.{key} looks like a credential; the ledger must never store credentials")
        if isinstance(value, Mapping):
            _reject_config_secrets(value, f"{where}.{key}")
