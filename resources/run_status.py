"""A run's progress and spend in one small dict: what `spotlight status` shows and the coordinator publishes.

The ledger lives on the reserved node, where only the coordinator opens it; so the
coordinator copies this summary into the Redis queue (`RedisQueue.publish_info`) every few
seconds, for `spotlight status` on a laptop and for the spot workers' spend gate
(`python -m resources.run_status --queue URL`: exit 3 once the spend reached the cap, so a
recovered spot job ends instead of sampling past the budget).

Example:
    status = ledger_status(ledger.query)             # or lambda sql: query_ledger(path, sql)
    queue.publish_info({**status, "max_usd": 200.0})
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from typing import Any, Callable, Mapping

log = logging.getLogger("spotlight.run_status")
EXIT_OVER_BUDGET = 3
"""The gate's exit code once the ledger's spend reached the cap (the spot task then ends its job with 0)."""

_SQL = {
    "iteration": "SELECT max(iteration) FROM iterations WHERE status = 'succeeded'",
    "heldout_score": "SELECT score FROM validation ORDER BY iteration DESC LIMIT 1",
    "usd_total": "SELECT usd_total FROM run_cost",
    "workers_alive": "SELECT count(*) FROM workers WHERE role = 'rollout' AND ended_at IS NULL",
    "spot_workers_alive": "SELECT count(*) FROM workers WHERE role = 'rollout' AND ended_at IS NULL AND spot",
    "preemptions": "SELECT count(*) FROM preemptions",
}


def ledger_status(query: Callable[[str], Any]) -> dict[str, Any]:
    """Last finished iteration, latest held-out score, dollars so far, live rollout workers, preemptions."""
    out = {}
    for name, sql in _SQL.items():
        rows = query(sql).rows
        out[name] = rows[0][0] if rows else None
    return out


def over_budget(info: Mapping[str, Any], max_usd: float | None = None) -> bool:
    """True once the spend reached the cap (`max_usd`, else the cap the coordinator published)."""
    cap = max_usd if max_usd is not None else info.get("max_usd")
    spent = info.get("usd_total")
    return cap is not None and spent is not None and spent >= cap


class StatusPublisher:
    """Copies `ledger_status` (plus `extra`, e.g. the cap) into the queue every `every_s` seconds, in a thread."""

    def __init__(self, queue: Any, query: Callable[[str], Any], extra: Mapping[str, Any], every_s: float = 5.0) -> None:
        self.queue, self.query, self.extra, self.every_s = queue, query, dict(extra), every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="run-status", daemon=True)

    def __enter__(self) -> "StatusPublisher":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.publish()

    def publish(self) -> None:
        from resources.queue import QueueError

        try:
            self.queue.publish_info({**ledger_status(self.query), **self.extra, "published_at": time.time()})
        except QueueError as err:  # status is advisory: the run goes on
            log.warning("run status not published: %s", err)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.publish()


def main(argv: list[str] | None = None) -> int:
    """The spend gate: 0 = go on sampling, EXIT_OVER_BUDGET = the cap is reached. An unreadable queue lets the
    worker start (it cannot work without the queue anyway, and says why)."""
    parser = argparse.ArgumentParser(prog="python -m resources.run_status", description=main.__doc__.split(".")[0])
    parser.add_argument("--queue", required=True, help="The run's Redis queue (password from SPOTLIGHT_REDIS_PASSWORD).")
    args = parser.parse_args(argv)
    from resources.queue import QueueError
    from resources.queues import open_queue

    try:
        with open_queue(args.queue) as queue:
            info = queue.info() if hasattr(queue, "info") else {}
    except (ValueError, QueueError) as err:
        print(f"resources.run_status: cannot read the run's spend ({err}); starting anyway", file=sys.stderr)
        return 0
    if over_budget(info):
        print(f"resources.run_status: the run spent ${info['usd_total']:.2f} of its ${info['max_usd']:.2f} cap; "
              "not starting another worker", file=sys.stderr)
        return EXIT_OVER_BUDGET
    return 0


if __name__ == "__main__":
    sys.exit(main())
