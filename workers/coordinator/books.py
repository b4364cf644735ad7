"""What the phases write to the run ledger besides their results: the run, the reserved node, phases and their cost.

The reserved node (trainer + coordinator) is recorded once per iteration as worker
`reserved-it-000012`, started by the sync phase and ended by the report, so cost per
iteration and per phase come out of the ledger's views whether the iteration ran from
`spotlight run` or from the Dagster UI. Every write is keyed, so re-running an asset
replaces its rows instead of adding new ones.

Example:
    begin_iteration(ledger, ctx, 3)                # ctx: workers.coordinator.context.RunContext
    with phase(ledger, 3, "train") as window: ...
    cost = phase_cost(ledger, 3, "train")       # {"usd": ..., "usd_spot": ..., "usd_reserved": ..., "wall_s": ...}
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

from resources.keys import iteration_label
from resources.ledger import Ledger


def reserved_worker_id(iteration: int) -> str:
    return f"reserved-{iteration_label(iteration)}"


def begin_iteration(ledger: Ledger, ctx, iteration: int) -> None:
    """Run row (first start time kept), the reserved node's lifetime for this iteration, the iteration row."""
    recorded = {
        "train": dataclasses.asdict(ctx.train),
        "iterations": ctx.num_iterations,
        "anchor_every": ctx.anchor_every,
        "checkpoint": ctx.checkpoint,
    }
    ledger.start_run(
        ctx.run, preset=ctx.preset, config=recorded, store_url=ctx.store_url, queue_url=public_url(ctx.queue_url)
    )
    ledger.start_worker(
        reserved_worker_id(iteration),
        role="trainer",
        instance_type="reserved-node",
        spot=False,
        num_gpus=0,
        usd_per_hour=ctx.reserved_usd_per_hour,
    )
    ledger.start_iteration(iteration, weights_version=iteration)


def public_url(url: str | None) -> str | None:
    """The URL without a password (a redis:// queue URL may carry one; the ledger must not)."""
    if not url:
        return url
    parsed = urlsplit(url)
    if parsed.password is None:
        return url
    host = parsed.hostname + (f":{parsed.port}" if parsed.port else "")
    return urlunsplit(parsed._replace(netloc=host))


def end_iteration(ledger: Ledger, ctx, iteration: int) -> None:
    """Close the iteration and its reserved node; the final iteration also closes the run."""
    ledger.end_iteration(iteration)
    ledger.end_worker(reserved_worker_id(iteration), reason="finished")
    if iteration >= ctx.num_iterations:
        ledger.end_run(ctx.run, status="succeeded")


@dataclasses.dataclass
class Window:
    started_at: float
    ended_at: float | None = None

    @property
    def seconds(self) -> float:
        return (self.ended_at or time.time()) - self.started_at


@contextlib.contextmanager
def phase(ledger: Ledger, iteration: int, name: str) -> Iterator[Window]:
    """Record a phase window around a block (left open in the ledger if the block raises)."""
    window = Window(time.time())
    ledger.record_phase(iteration, name, window.started_at)
    yield window
    window.ended_at = time.time()
    ledger.record_phase(iteration, name, window.started_at, window.ended_at)


def phase_cost(ledger: Ledger, iteration: int, name: str) -> dict[str, float]:
    """USD of the capacity alive during the phase, split spot / reserved, and its wall time."""
    rows = ledger.query(
        "SELECT wall_s, usd, usd_spot, usd_reserved FROM cost_per_phase WHERE iteration = ? AND phase = ?",
        [iteration, name],
    ).as_dicts()
    if not rows:
        return {"wall_s": 0.0, "usd": 0.0, "usd_spot": 0.0, "usd_reserved": 0.0}
    return {k: float(v or 0.0) for k, v in rows[0].items()}


def base_validation_score(ledger: Ledger) -> float | None:
    """The held-out score of weights version 0 (None until iteration 0 is validated)."""
    rows = ledger.query("SELECT score FROM validation WHERE weights_version = 0").rows
    return float(rows[0][0]) if rows else None


def close_dangling_workers(ledger) -> int:
    """Workers a killed run left open end as interrupted at the ledger's last recorded moment (not now:
    the time the run was down is not billed)."""
    last = ledger.query("SELECT max(coalesce(ended_at, started_at)) FROM phases").rows[0][0]
    open_ids = [
        r[0]
        for r in ledger.query(
            "SELECT worker_id FROM workers WHERE ended_at IS NULL AND worker_id NOT LIKE 'reserved-%'"
        ).rows
    ]
    for worker_id in open_ids:
        ledger.end_worker(worker_id, reason="interrupted", at=last)
    return len(open_ids)


def interrupt_run(ledger: Ledger, run: str) -> None:
    """Mark a run that stopped before its last iteration as interrupted (nothing when it never started)."""
    with contextlib.suppress(ValueError):  # no run row yet if iteration 0 never started
        ledger.end_run(run, status="interrupted")
