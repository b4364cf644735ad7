"""SqliteQueue: the embedded request queue, one SQLite file shared by many processes on one machine."""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from resources.queue.base import QueueConfig, QueueUnavailableError, RequestQueue
from resources.queue.records import (
    KINDS_BY_PRIORITY,
    DeadLetter,
    Lease,
    QueueStats,
    Request,
    check_lease_s,
    check_result_key,
    check_worker_id,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,  -- FIFO order within a priority
    request_id  TEXT NOT NULL UNIQUE,
    iteration   INTEGER NOT NULL,
    kind        TEXT NOT NULL,
    priority    INTEGER NOT NULL,
    body        TEXT NOT NULL,
    state       TEXT NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'dead', 'cancelled')),
    attempts    INTEGER NOT NULL DEFAULT 0,
    worker_id   TEXT,
    lease_token TEXT,
    lease_until REAL,                               -- time.time(), expired when <= now
    result_key  TEXT,
    dead_seq    INTEGER                             -- order of dead-lettering
);
CREATE TABLE IF NOT EXISTS finished (               -- the exactly-once record of acked requests, without bodies
    request_id  TEXT PRIMARY KEY,
    iteration   INTEGER NOT NULL,
    result_key  TEXT NOT NULL
) WITHOUT ROWID;
DROP INDEX IF EXISTS requests_claimable;
CREATE INDEX IF NOT EXISTS requests_pending ON requests (priority, seq) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS requests_leased ON requests (lease_until) WHERE state = 'leased';
CREATE INDEX IF NOT EXISTS requests_iteration ON requests (iteration, state);
CREATE INDEX IF NOT EXISTS finished_iteration ON finished (iteration);
INSERT OR IGNORE INTO finished SELECT request_id, iteration, result_key FROM requests WHERE state = 'done';
DELETE FROM requests WHERE state = 'done'
"""
# claim = the first of two index searches, never a scan: the oldest pending request of the best
# priority (requests_pending), and the best expired lease (requests_leased: only leases past due).
CLAIM_PENDING_SQL = (
    "SELECT priority, seq, body, attempts FROM requests WHERE state = 'pending' ORDER BY priority, seq LIMIT 1"
)
CLAIM_EXPIRED_SQL = (
    "SELECT priority, seq, body, attempts FROM requests WHERE state = 'leased' AND lease_until <= ? "
    "ORDER BY priority, seq LIMIT 1"
)
_OPEN = "('pending', 'leased')"


class SqliteQueue(RequestQueue):
    """Open requests are rows of one table; every operation is one short IMMEDIATE transaction.

    An ack moves the request out of `requests` into `finished` (id, iteration, result key; no
    body), so the table claims search holds only open, dead and cancelled requests, and claim
    is two index searches whatever the queue's history. `finished` keeps the exactly-once
    record (a re-put id is skipped, a second ack is refused) until `purge_finished` drops
    old iterations from it.

    WAL mode lets readers (stats, wait_until_done) run while a worker writes, and the busy
    timeout makes concurrent writers queue up on the file lock instead of failing. Lease
    times use each process's `time.time()`, which is fine on one machine. The object is
    thread-safe (a worker may heartbeat from a thread); open one per process. `clock`
    replaces `time.time` for lease times (the simulator, workers/sim, runs the queue on
    simulated time).
    """

    def __init__(
        self, path: str | Path, config: QueueConfig = QueueConfig(), clock: Callable[[], float] = time.time
    ) -> None:
        self.path = Path(path).expanduser().resolve()
        self.config = config
        self._clock = clock
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(
                self.path, timeout=config.connect_timeout_s, isolation_level=None, check_same_thread=False
            )
            self._set_wal(config.connect_timeout_s)
            # NORMAL in WAL mode survives a process crash; only an OS crash may lose the last commits.
            self._db.execute("PRAGMA synchronous=NORMAL")
            with self._write() as db:
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    db.execute(statement)
        except (OSError, sqlite3.Error) as err:
            raise QueueUnavailableError(f"cannot open the SQLite queue {self.path}: {err}") from err

    def _set_wal(self, timeout_s: float) -> None:
        """Switch to WAL. Two processes opening a new queue file at once can make the switch fail with "database
        is locked" at once, without SQLite's busy wait: retry it until `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as err:
                if "locked" not in str(err) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"sqlite://{self.path.as_posix()}"

    def __repr__(self) -> str:
        return f"SqliteQueue({str(self.path)!r})"

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: takes the write lock up front, so no deadlock on upgrade."""
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as err:
                raise QueueUnavailableError(
                    f"SQLite queue {self.path} stayed locked for {self.config.connect_timeout_s:g} s: {err}"
                ) from err
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _read(self, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, tuple(params)).fetchall()

    def put(self, requests: Iterable[Request | Mapping[str, Any]]) -> int:
        rows = [Request.from_dict(r) for r in requests]
        with self._write() as db:
            before = db.total_changes
            db.executemany(
                "INSERT OR IGNORE INTO requests (request_id, iteration, kind, priority, body, state) "
                "SELECT ?, ?, ?, ?, ?, 'pending' WHERE NOT EXISTS (SELECT 1 FROM finished WHERE request_id = ?)",
                [(r.request_id, r.iteration, r.kind, r.priority, r.to_json(), r.request_id) for r in rows],
            )
            return db.total_changes - before

    def claim(self, worker_id: str, lease_s: float) -> Lease | None:
        check_worker_id(worker_id)
        lease_s = check_lease_s(lease_s, self.config.max_lease_s)
        token = uuid.uuid4().hex
        with self._write() as db:
            now = self._clock()
            self._bury_exhausted(db, now)
            candidates = [db.execute(CLAIM_PENDING_SQL).fetchone(), db.execute(CLAIM_EXPIRED_SQL, (now,)).fetchone()]
            candidates = [c for c in candidates if c is not None]
            if not candidates:
                return None
            _, seq, body, attempts = min(candidates)
            db.execute(
                "UPDATE requests SET state = 'leased', attempts = ?, worker_id = ?, lease_token = ?, lease_until = ? "
                "WHERE seq = ?",
                (attempts + 1, worker_id, token, now + lease_s, seq),
            )
        return Lease(Request.from_json(body), worker_id, attempts + 1, lease_s, token)

    def _bury_exhausted(self, db: sqlite3.Connection, now: float) -> None:
        """Dead-letter expired leases that used their last delivery (the same moment Redis would)."""
        db.execute(
            "UPDATE requests SET state = 'dead', lease_token = NULL, "
            "dead_seq = (SELECT coalesce(max(dead_seq), 0) + 1 FROM requests) "
            "WHERE state = 'leased' AND lease_until <= ? AND attempts >= ?",
            (now, self.config.max_deliveries),
        )

    def heartbeat(self, lease: Lease) -> bool:
        return self._extend(lease, lease.lease_s)

    def release(self, lease: Lease) -> bool:
        return self._extend(lease, 0.0)

    def _extend(self, lease: Lease, lease_s: float) -> bool:
        # Still ours while nobody else claimed it, even if it expired a moment ago: less lost work.
        with self._write() as db:
            changed = db.execute(
                "UPDATE requests SET lease_until = ? WHERE request_id = ? AND state = 'leased' AND lease_token = ?",
                (self._clock() + lease_s, lease.request_id, lease.token),
            ).rowcount
        return changed == 1

    def ack(self, lease: Lease | str, result_key: str) -> bool:
        request_id = lease.request_id if isinstance(lease, Lease) else lease
        check_result_key(result_key)
        with self._write() as db:
            changed = db.execute(
                "INSERT OR IGNORE INTO finished SELECT request_id, iteration, ? FROM requests "
                "WHERE request_id = ? AND state IN ('pending', 'leased', 'dead')",
                (result_key, request_id),
            ).rowcount
            db.execute(
                "DELETE FROM requests WHERE request_id = ? AND state IN ('pending', 'leased', 'dead')", (request_id,)
            )
        return changed == 1

    def purge_finished(self, before_iteration: int) -> int:
        """Forget the acked requests of iterations < `before_iteration`; returns how many.

        Their ids become unknown: `states` says 'unknown', `results` omits them, and putting one
        again queues it afresh. Call it only for iterations whose results are recorded and
        whose requests nobody will put again (the coordinator's finished iterations).
        """
        if isinstance(before_iteration, bool) or not isinstance(before_iteration, int):
            raise ValueError(f"before_iteration must be an int, got {before_iteration!r}")
        with self._write() as db:
            return db.execute("DELETE FROM finished WHERE iteration < ?", (before_iteration,)).rowcount

    def cancel_iteration(self, iteration: int, kind: str | None = None) -> int:
        if kind is not None and kind not in KINDS_BY_PRIORITY:
            raise ValueError(f"kind must be one of {KINDS_BY_PRIORITY} or None, got {kind!r}")
        sql = f"UPDATE requests SET state = 'cancelled', lease_token = NULL WHERE iteration = ? AND state IN {_OPEN}"
        params: tuple[Any, ...] = (iteration,)
        if kind is not None:
            sql, params = sql + " AND kind = ?", (iteration, kind)
        with self._write() as db:
            return db.execute(sql, params).rowcount

    def stats(self) -> QueueStats:
        rows = self._read(
            "SELECT CASE WHEN state = 'leased' AND lease_until <= ? THEN 'pending' ELSE state END AS s, count(*) "
            "FROM requests GROUP BY s",
            (self._clock(),),
        )
        counts = dict(rows)
        counts["done"] = self._read("SELECT count(*) FROM finished")[0][0]
        return QueueStats(*(counts.get(s, 0) for s in ("pending", "leased", "done", "dead", "cancelled")))

    def states(self, request_ids: Iterable[str]) -> dict[str, str]:
        ids = list(request_ids)
        found: dict[str, str] = {}
        now = self._clock()
        for chunk in _chunks(ids):
            marks = ",".join("?" * len(chunk))
            for rid, state, until in self._read(
                f"SELECT request_id, state, lease_until FROM requests WHERE request_id IN ({marks})", chunk
            ):
                found[rid] = "pending" if state == "leased" and until <= now else state
            for (rid,) in self._read(f"SELECT request_id FROM finished WHERE request_id IN ({marks})", chunk):
                found[rid] = "done"
        return {rid: found.get(rid, "unknown") for rid in ids}

    def results(self, request_ids: Iterable[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for chunk in _chunks(list(request_ids)):
            marks = ",".join("?" * len(chunk))
            out.update(
                self._read(
                    f"SELECT request_id, result_key FROM finished WHERE request_id IN ({marks})",
                    chunk,
                )
            )
        return out

    def dead_letters(self) -> list[DeadLetter]:
        rows = self._read("SELECT body, attempts FROM requests WHERE state = 'dead' ORDER BY dead_seq, seq")
        return [DeadLetter(Request.from_json(body), attempts) for body, attempts in rows]


def _chunks(ids: list[str], size: int = 500) -> Iterator[list[str]]:
    # SQLite limits the number of bound parameters per statement.
    for start in range(0, len(ids), size):
        yield ids[start : start + size]
