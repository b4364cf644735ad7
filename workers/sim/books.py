"""The simulated run's ledger rows, kept in memory while SimPy runs, then written into an ordinary ledger.

The file is made by the real `resources.ledger.Ledger` (same migrations, tables and views),
so `spotlight ledger "SELECT * FROM cost_per_iteration" --db OUT/ledger.duckdb` works on
a simulated run as on a real one. Rows are bulk-loaded from CSV at the end: the Ledger's
one-record-per-call writer costs about 25 ms a call on a file, too slow for 50k attempts.

Example:
    books = SimBooks(epoch_s=1.77e9)
    books.worker_start("g0.0", spot=True, usd_per_hour=1.46, gpu_type="H200", t=0.0)
    ...
    books.write(Ledger(out / "ledger.duckdb"), run_id="sim", config={...})
"""

from __future__ import annotations

import csv
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping

from resources.ledger import WORKER_COLUMNS, Ledger

COLUMNS = {
    "workers": WORKER_COLUMNS,
    "iterations": ("iteration", "weights_version", "started_at", "ended_at", "critical_path_s", "status"),
    "phases": ("iteration", "phase", "started_at", "ended_at"),
    "requests": (
        "request_id",
        "iteration",
        "kind",
        "prompt",
        "seed",
        "weights_version",
        "worker_id",
        "attempts",
        "enqueued_at",
        "finished_at",
        "arm",
        "status",
    ),
    "attempts": (
        "request_id",
        "attempt",
        "worker_id",
        "started_at",
        "ended_at",
        "outcome",
        "resumed_from_step",
        "steps_done",
    ),
    "preemptions": (
        "worker_id",
        "preempted_at",
        "notice_s",
        "request_id",
        "steps_lost",
        "seconds_lost",
        "state_committed",
    ),
    "exploration": (
        "iteration",
        "arm",
        "budget_s",
        "time_used_s",
        "num_requests",
        "seeds_per_prompt",
        "cache_level",
        "overhead_s",
        "variance_gain",
        "ucb_score",
        "fallback_random",
    ),
    "validation": ("iteration", "weights_version", "score", "num_prompts", "recorded_at"),
}
_TIMES = {"started_at", "ended_at", "enqueued_at", "finished_at", "preempted_at", "recorded_at"}


def union_s(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (the ledger's critical path)."""
    total, end = 0.0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total, end = total + (e - s), e
        elif e > end:
            total, end = total + (e - end), e
    return total


class SimBooks:
    """Ledger rows in simulated seconds; `epoch_s` maps second 0 to a wall-clock time."""

    def __init__(self, epoch_s: float) -> None:
        self.epoch_s = epoch_s
        self.rows: dict[str, list[dict[str, Any]]] = {t: [] for t in COLUMNS}
        self.workers: dict[str, dict[str, Any]] = {}
        self.phase_rows: dict[tuple[int, str], dict[str, Any]] = {}

    def worker_start(
        self,
        worker_id: str,
        *,
        role: str,
        spot: bool,
        usd_per_hour: float,
        gpu_type: str | None,
        t: float,
        source: str,
        num_gpus: int = 1,
    ) -> None:
        row = dict(
            worker_id=worker_id,
            role=role,
            instance_type="sim",
            gpu_type=gpu_type,
            num_gpus=num_gpus,
            spot=spot,
            usd_per_hour=usd_per_hour,
            price_source=source,
            started_at=t,
            ended_at=None,
            end_reason=None,
        )
        self.workers[worker_id] = row
        self.rows["workers"].append(row)

    def worker_end(self, worker_id: str, reason: str, t: float) -> None:
        row = self.workers[worker_id]
        if row["ended_at"] is None:
            row["ended_at"], row["end_reason"] = t, reason

    def phase(self, iteration: int, phase: str, start: float, end: float) -> None:
        row = dict(iteration=iteration, phase=phase, started_at=start, ended_at=end)
        self.phase_rows[(iteration, phase)] = row
        self.rows["phases"].append(row)

    def iteration(self, iteration: int, start: float, end: float) -> None:
        spans = [(r["started_at"], r["ended_at"]) for (k, _), r in self.phase_rows.items() if k == iteration]
        self.rows["iterations"].append(
            dict(
                iteration=iteration,
                weights_version=iteration,
                started_at=start,
                ended_at=end,
                critical_path_s=union_s(spans),
                status="succeeded",
            )
        )

    def add(self, table: str, **row: Any) -> None:
        self.rows[table].append(row)

    def write(self, ledger: Ledger, *, run_id: str, config: Mapping[str, Any], end_s: float) -> None:
        """Close open workers at `end_s`, then load every table into `ledger` (a new or in-memory one)."""
        for row in self.workers.values():
            if row["ended_at"] is None:
                row["ended_at"], row["end_reason"] = end_s, "finished"
        ledger.start_run(run_id, preset="simulated", config=config, at=self.stamp(0.0))
        with tempfile.TemporaryDirectory() as tmp:
            for table, columns in COLUMNS.items():
                if not self.rows[table]:
                    continue
                path = Path(tmp) / f"{table}.csv"
                with path.open("w", newline="") as f:
                    out = csv.writer(f)
                    out.writerow(columns)
                    out.writerows([self._cell(c, r.get(c)) for c in columns] for r in self.rows[table])
                names = ", ".join(columns)
                ledger.query(
                    f"INSERT INTO {table} ({names}) SELECT {names} FROM read_csv(?, header = true, all_varchar = true)",
                    [str(path)],
                )
        ledger.end_run(run_id, status="succeeded", at=self.stamp(end_s))

    def stamp(self, t: float) -> datetime:
        return datetime.fromtimestamp(self.epoch_s + t, timezone.utc).replace(tzinfo=None)

    def _cell(self, column: str, value: Any) -> Any:
        if value is None:
            return ""
        if column in _TIMES:
            return self.stamp(value).isoformat(sep=" ")
        return value
