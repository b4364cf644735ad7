"""The queue room: the interface (resources/queue/base.py, re-exported here) and `open_queue`.

`open_queue` picks the backend for a URL (SQLite file or Redis); the backends live in
resources/queue/sqlite.py and resources/queue/redis_streams.py and are imported lazily
(Redis's client only when a redis:// URL is opened).

Example:
    queue = open_queue("runs/demo/queue.db")                 # or "redis://:pw@host:6379/0"
    queue.put([...]); outcome = queue.wait_until_done(ids, timeout_s=600)
"""

from __future__ import annotations

from pathlib import Path

from resources.queue.base import (
    QueueConfig,
    QueueError,
    QueueStalledError,
    QueueUnavailableError,
    RequestQueue,
    parse_queue_url,
)
from resources.queue.sqlite import SqliteQueue


def open_queue(url: str | Path, config: QueueConfig = QueueConfig()) -> RequestQueue:
    """Open a queue from a URL: a file path or `sqlite:///abs/path.db` (SqliteQueue), or
    `redis://host:port/db` or `rediss://host:port/db` (TLS) (RedisQueue; the password from
    SPOTLIGHT_REDIS_PASSWORD or the file SPOTLIGHT_REDIS_PASSWORD_FILE names, or, kept out of
    command lines, the URL's `:password@`). Raises QueueUnavailableError when the
    queue cannot be reached within `config.connect_timeout_s`."""
    where = parse_queue_url(url)
    if isinstance(where, Path):
        return SqliteQueue(where, config)
    from resources.queue.redis_streams import RedisQueue  # lazy: pulls redis

    return RedisQueue(where, config)


def check_queue_reachable(url: str | Path, config: QueueConfig = QueueConfig()) -> None:
    """Connect to a Redis queue now: QueueUnavailableError naming host:port/db (never the password) when it
    cannot be reached within `config.connect_timeout_s`. A SQLite queue is a local file the run creates
    itself, so nothing is opened or written for it."""
    if isinstance(parse_queue_url(url), Path):
        return
    open_queue(url, config).close()


__all__ = [
    "QueueConfig",
    "QueueError",
    "QueueStalledError",
    "QueueUnavailableError",
    "RequestQueue",
    "check_queue_reachable",
    "open_queue",
    "parse_queue_url",
]
