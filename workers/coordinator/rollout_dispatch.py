"""Who samples an iteration's rollout requests, behind one call: the trainer in-process, a local cluster,
or queue workers.

Every path ends with one committed result per request in the store (the rollout worker's
result format), so the train phase never knows which one ran.

Example:
    summary = sample_requests(ctx, k, requests)
    summary.preemptions, summary.workers_started
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from resources.cluster import ClusterConfig, LocalCluster, WorkerSlot
from resources.cluster.preemption import poisson_trace
from resources.ledger import Ledger
from resources.ledger.records import to_utc
from resources.queue import open_queue
from workers.coordinator.context import RunContext, Sampling
from workers.coordinator.rollout import collect_in_process, queue_batches
from workers.coordinator.worker_pool import pool_devices
from workers.rollout.state import rollout_request


@dataclass
class PhaseSummary:
    mode: str
    num_requests: int
    enqueued_at: float
    workers_started: int = 0
    preemptions: int = 0


class RolloutsIncompleteError(RuntimeError):
    """The workers did not finish the iteration's requests in time (or gave some up)."""


def sample_requests(ctx: RunContext, iteration: int, requests: list) -> PhaseSummary:
    """Sample every request; returns once each has a committed result in the store."""
    workers, store, queue_url, ledger = ctx.sampling, ctx.store, ctx.queue_url, ctx.ledger
    run, config = ctx.run, ctx.train
    summary = PhaseSummary(workers.mode, len(requests), time.time())
    if workers.mode == "inprocess":
        collect_in_process(store, run, config, iteration, requests, device=ctx.device)
        return summary
    if queue_url is None:
        raise ValueError(f"rollout mode {workers.mode!r} needs a queue: configure the queue resource")

    slots = _phase_slots(workers, ctx.device, iteration) if workers.mode == "local_cluster" else []
    batches = queue_batches(requests, config.seeds_per_request)
    ids = [rid for rid, _ in batches]
    with open_queue(queue_url, ctx.queue_config) as queue:
        queue.put([rollout_request(rid, iteration, spec) for rid, spec in batches])
        if workers.mode == "local_cluster":
            _run_local_cluster(workers, slots, store.url, queue_url, ledger, queue, ids, iteration, summary)
        outcome = queue.wait_until_done(ids, timeout_s=workers.timeout_s)
        if outcome.complete and iteration >= 2:
            # Iteration k-2 is consumed (its rollouts trained on, its exploration planned k-1): forget its done
            # requests, so the queue holds at most two iterations of them however long the run.
            queue.purge_finished(before_iteration=iteration - 1)
    if workers.mode == "workers":
        # Workers outside this phase (the run-long cluster of `spotlight run`) record their
        # preemptions in the ledger: count those that hit while the phase waited.
        summary.preemptions = _preemptions_since(ledger, summary.enqueued_at)
    if not outcome.complete or len(outcome.results) != len(ids):
        raise RolloutsIncompleteError(
            f"iteration {iteration}: {len(outcome.results)} of {len(ids)} rollout requests finished within "
            f"{workers.timeout_s:g} s (unfinished: {sorted(outcome.unfinished)[:5]}...); "
            f"are workers pulling from {queue_url}?"
        )
    return summary


def _phase_slots(workers: Sampling, device: str, iteration: int) -> list[WorkerSlot]:
    """A phase's worker slots on the run's device (one per free GPU on CUDA); slot names carry the iteration so
    worker ids stay unique in the ledger. ValueError when the trainer holds the only GPU."""
    slots = [
        WorkerSlot(
            f"it{iteration}w{i}",
            spot=i >= workers.num_reserved,
            usd_per_hour=workers.spot_usd_per_hour if i >= workers.num_reserved else workers.reserved_usd_per_hour,
            device=place.device,
            visible_devices=place.visible_devices,
        )
        for i, place in enumerate(pool_devices(device, 1, workers.num_workers))
    ]
    if not slots:
        raise ValueError(
            f"rollout mode local_cluster on {device}: the trainer holds this machine's only GPU, leaving none for a "
            "worker; sample in the trainer (deployment.rollouts inprocess)"
        )
    return slots


def _run_local_cluster(
    workers: Sampling,
    slots: list[WorkerSlot],
    store_url: str,
    queue_url: str,
    ledger: Ledger,
    queue,
    ids: list[str],
    iteration: int,
    summary: PhaseSummary,
) -> None:
    """Worker processes for this phase only."""
    config = ClusterConfig(
        queue_url,
        store_url,
        commit_every=workers.commit_every,
        lease_s=workers.lease_s,
        restart_delay_s=workers.restart_delay_s,
        log_dir=str(Path(workers.log_dir)) if workers.log_dir else None,
    )
    trace = poisson_trace(
        [s.name for s in slots if s.spot],
        rate_per_hour=workers.preemptions_per_hour,
        duration_s=workers.timeout_s,
        notice_share=workers.notice_share,
        seed=iteration,
    )
    with LocalCluster(config, slots, ledger) as cluster:
        done = lambda: queue.wait_until_done(ids, timeout_s=0).complete  # noqa: E731
        result = cluster.run_until(done, trace=trace, timeout_s=workers.timeout_s)
    summary.workers_started += result.workers_started
    summary.preemptions += len(result.preemptions)


def _preemptions_since(ledger: Ledger, since: float) -> int:
    rows = ledger.query("SELECT count(*) FROM preemptions WHERE preempted_at >= ?", [to_utc(since)]).rows
    return int(rows[0][0])
