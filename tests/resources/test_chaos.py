"""Chaos: a rollout batch on three local workers while every one of them is preempted once (a SIGTERM, two SIGKILLs).

Every request must complete exactly once, and the results must be bit-identical to a
fault-free run: resumption from committed state changes nothing.
"""

from __future__ import annotations

from collections import Counter

import pytest

from resources.cluster import ClusterConfig, LocalCluster, WorkerSlot
from resources.cluster.ledger import result_records
from resources.cluster.preemption import PreemptionEvent
from resources.keys import rollouts_prefix
from resources.ledger import Ledger
from resources.queue import open_queue
from resources.queue.records import Request
from workers.algo.sampler import SamplerConfig
from workers.rollout.request import work_request
from workers.rollout.state import RolloutSpec, rollout_request
from workers.rollout.weights import PolicyHolder

NUM_REQUESTS = 64
PROMPTS = ["a red circle", "two blue squares", "a green triangle left of a yellow circle", "three purple circles"]
SAMPLER = SamplerConfig(num_steps=8, noise_level=0.7)
TRACE = [  # slot, notice: 0 = SIGKILL without notice, > 0 = SIGTERM with that much notice
    PreemptionEvent(1.0, "w0", 5.0),
    PreemptionEvent(1.5, "w1", 0.0),
    PreemptionEvent(2.5, "w2", 0.0),
]


def _requests(iteration: int) -> list[dict]:
    return [
        rollout_request(f"r{i:03d}", iteration, RolloutSpec("demo", PROMPTS[i % len(PROMPTS)], 1000 + i, 0, SAMPLER))
        for i in range(NUM_REQUESTS)
    ]


def _fault_free_hashes(store) -> dict[str, str]:
    holder = PolicyHolder(store)
    return {
        r["request_id"]: work_request(
            Request.from_dict(r), 1, store, holder, worker_id="ref", commit_every=8
        ).result_hash
        for r in _requests(0)
    }


@pytest.mark.slow  # ~56 CPU-seconds (six worker start-ups); minutes on a shared, loaded machine
def test_a_preempted_batch_completes_exactly_once_with_the_fault_free_results(tmp_path, rollout_store) -> None:
    expected = _fault_free_hashes(rollout_store)
    requests = _requests(1)
    queue = open_queue(tmp_path / "queue.db")
    ledger = Ledger(tmp_path / "ledger.duckdb")
    config = ClusterConfig(
        str(tmp_path / "queue.db"),
        str(rollout_store.root),
        commit_every=2,
        lease_s=2.0,
        restart_delay_s=1.0,
        log_dir=str(tmp_path / "logs"),
        ready_timeout_s=600,
    )
    slots = [
        WorkerSlot(f"w{i}", instance_type="local-cpu", spot=True, usd_per_hour=0.4, step_delay_s=0.02) for i in range(3)
    ]
    with LocalCluster(config, slots, ledger) as cluster:
        queue.put(requests)  # once every worker is ready, so the trace's clock and the work start together
        summary = cluster.run_until(lambda: queue.stats().open == 0, trace=TRACE, timeout_s=240)
    assert summary.completed

    ids = [r["request_id"] for r in requests]
    committed = rollout_store.list_commits(rollouts_prefix("demo", 1))
    assert sorted(c.rsplit("/", 1)[1] for c in committed) == ids  # one result per request, none missing
    first_acks = Counter(e["request_id"] for e in cluster.tracker.events if e["event"] == "acked" and e["first"])
    assert first_acks == Counter(ids)  # each completed exactly once
    hashes = {r.request_id: r.result_hash for r in result_records(rollout_store, requests)}
    assert hashes == expected  # bit-identical to the fault-free run, request by request

    # Every one of the three first workers was preempted by the trace: 64 requests x 8 steps x 0.02 s are 10 s of
    # step delays alone, over 3 s on three workers, so the batch is still running at the last event, 2.5 s in.
    preempted = {p.worker_id for p in summary.preemptions}
    assert preempted == {"w0.0", "w1.0", "w2.0"} and summary.skipped_events == 0, (preempted, summary.skipped_events)
    assert {p.notice_s > 0 for p in summary.preemptions} == {True, False}  # SIGTERMs and SIGKILLs
    assert all(p.steps_lost == 0 for p in summary.preemptions if p.notice_s > 0)

    ledger.record_requests(result_records(rollout_store, requests))
    resumed = ledger.query("SELECT count(*) FROM attempts WHERE resumed_from_step > 0").rows[0][0]
    assert resumed >= 1, "no request was resumed from committed state: the trace missed in-flight work"
    workers = ledger.query(
        "SELECT count(*), count(*) FILTER (WHERE end_reason = 'preempted'), sum(usd) FROM worker_costs"
    ).rows[0]
    assert workers[0] == summary.workers_started and workers[1] == len(preempted) and workers[2] > 0
    assert ledger.query("SELECT count(*) FROM requests WHERE status = 'done'").rows[0][0] == NUM_REQUESTS
    assert ledger.query("SELECT sum(preemptions) FROM preemption_summary").rows[0][0] == len(summary.preemptions)
