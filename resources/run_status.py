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

from resources.processes import stop_process
from resources.queue import open_queue
from resources.queue.base import QueueError

log = logging.getLogger("spotlight.run_status")
EXIT_OVER_BUDGET = 3
"""The gate's exit code once the ledger's spend reached the cap or the run ended (the spot task then ends its job
with 0)."""
ENDED_KEY = "run_ended"
"""Published by the reserved node's run block: true once `spotlight run` exited after its last iteration."""
STOP_GRACE_S = 120.0
"""How long a worker stopped because the run ended may take to give its request back before it is killed."""

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
        try:
            self.queue.publish_info({**ledger_status(self.query), **self.extra, "published_at": time.time()})
        except QueueError as err:  # status is advisory: the run goes on
            log.warning("run status not published: %s", err)

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            self.publish()


def run_ended(info: Mapping[str, Any]) -> bool:
    """True once the reserved node's run line has exited after its last iteration (`--mark ended`) or the spend
    reached the cap: no more work will come, so a spot worker may end its job."""
    return bool(info.get(ENDED_KEY)) or over_budget(info)


def _read_info(url: str) -> dict[str, Any]:
    """The run's published summary; QueueError or ValueError when the queue cannot be read."""
    with open_queue(url) as queue:
        return queue.info() if hasattr(queue, "info") else {}


def supervise(
    command: list[str],
    url: str,
    every_s: float,
    read_info: Callable[[str], Mapping[str, Any]] = _read_info,
) -> int:
    """Run `command` (the spot worker) until it exits, or until the run has ended: then SIGTERM it (it gives its
    request back and commits) and return 0, so its managed job ends instead of being recovered. Returns the
    command's own exit code otherwise. An unreadable queue is no reason to stop: the worker says why itself."""
    import signal
    import subprocess

    child = subprocess.Popen(command)
    signal.signal(signal.SIGTERM, lambda *_: None)  # the job's SIGTERM reaches the worker directly (same group)
    ended = False
    while True:
        try:
            return 0 if ended else child.wait(timeout=every_s)
        except subprocess.TimeoutExpired:
            pass
        try:
            ended = run_ended(read_info(url))
        except (ValueError, QueueError):
            continue
        if ended:
            print(
                "resources.run_status: the run has ended; stopping this spot worker (its job ends with 0)",
                file=sys.stderr,
            )
            stop_process(child, STOP_GRACE_S)


def main(argv: list[str] | None = None) -> int:
    """The spend gate: 0 = go on sampling, EXIT_OVER_BUDGET = the cap is reached or the run has ended. An unreadable
    queue lets the worker start (it cannot work without the queue anyway, and says why). With `-- COMMAND...`: run the
    worker under supervision (`supervise`). With --mark: record that the run is running or has ended."""
    parser = argparse.ArgumentParser(prog="python -m resources.run_status", description=main.__doc__.split(".")[0])
    parser.add_argument(
        "--queue", required=True, help="The run's Redis queue (password from SPOTLIGHT_REDIS_PASSWORD)."
    )
    parser.add_argument("--mark", choices=("running", "ended"), help="Publish the run's state (the reserved node).")
    parser.add_argument("--every-s", type=float, default=30.0, help="How often a supervised worker checks the run.")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the worker's command line, to supervise")
    args = parser.parse_args(argv)

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if args.mark is not None:
        with open_queue(args.queue) as queue:
            queue.publish_info({ENDED_KEY: args.mark == "ended"})
        return 0
    try:
        info = _read_info(args.queue)
    except (ValueError, QueueError) as err:
        print(f"resources.run_status: cannot read the run's spend ({err}); starting anyway", file=sys.stderr)
        info = {}
    if over_budget(info):
        print(
            f"resources.run_status: the run spent ${info['usd_total']:.2f} of its ${info['max_usd']:.2f} cap; "
            "not starting another worker",
            file=sys.stderr,
        )
        return EXIT_OVER_BUDGET
    if run_ended(info):
        print("resources.run_status: the run has ended; not starting another worker", file=sys.stderr)
        return EXIT_OVER_BUDGET
    return supervise(command, args.queue, args.every_s) if command else 0


if __name__ == "__main__":
    sys.exit(main())
