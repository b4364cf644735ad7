"""The run ledger: a DuckDB file per run that records what happened and what it cost.

One process writes it (the coordinator) through the typed `record_*` methods below;
anyone can query it meanwhile with `spotlight ledger "SQL"` (see `db.py` for how reading
and writing share the file, `file.py` for the connection and the row buffer, `schema.py` for
the tables and views, docs/LEDGER.md for example queries).

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

import contextlib
import json
from typing import Any, Iterable, Iterator, Mapping

from resources.ledger.db import transaction
from resources.ledger.file import LedgerFile
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
from resources.ledger.schema import PHASES

_RUN_STATUSES = ("running", "succeeded", "failed", "interrupted")
WORKER_COLUMNS = (
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
"""The `workers` table's columns, in the order a bulk load writes them (the simulator's books too)."""


class Ledger(LedgerFile, HackingRecords):
    """Typed writer (and convenience reader) of one run's ledger file, or ':memory:'."""

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
        device_type: str | None = None,
        kernel_set: str | None = None,
    ) -> float:
        """Record a worker start with its price (from the price table unless given); return $/hour. `device_type`
        and `kernel_set` (workers/rollout/kernels.py) may come later, with its `ready` (`record_worker_kernels`)."""
        check_choice(role, WORKER_ROLES, "worker role")
        if usd_per_hour is None:
            if gpu_type is None:
                raise ValueError(f"worker {worker_id!r}: give gpu_type (priced from the table) or usd_per_hour")
            usd_per_hour, source = self.prices.usd_per_hour(gpu_type, spot=spot, num_gpus=num_gpus)
        else:
            if not usd_per_hour >= 0:
                raise ValueError(f"worker {worker_id!r}: usd_per_hour must be >= 0, got {usd_per_hour}")
            source = "given by the caller"
        row = [worker_id, role, instance_type, gpu_type, num_gpus, spot, usd_per_hour, source, to_utc(at), None, None]
        self._record_rows("workers", (*WORKER_COLUMNS, "device_type", "kernel_set"), [[*row, device_type, kernel_set]])
        return usd_per_hour

    def record_worker_kernels(self, worker_id: str, *, device_type: str, kernel_set: str) -> None:
        """What decides a started worker's float bits, as its `ready` event reports it."""
        self._update_one("workers", "worker_id", worker_id, device_type=device_type, kernel_set=kernel_set)

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
        """Rows of `seed_groups` (column -> value; absent nullable columns are NULL); a redone iteration replaces
        its rows."""
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
