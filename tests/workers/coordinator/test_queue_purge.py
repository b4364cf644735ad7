"""The coordinator forgets consumed iterations' done requests, so a long run's queue does not grow with them."""

from __future__ import annotations

import threading
from pathlib import Path

from resources.queue import open_queue
from workers.algo.sampler import SamplerConfig
from workers.coordinator.context import RunContext, Sampling
from workers.coordinator.rollout import PlannedRequest, request_id
from workers.coordinator.rollout_dispatch import sample_requests
from workers.rollout.state import RolloutSpec
from workers.trainer.grpo_trainer import TrainConfig

NUM_PROMPTS = 6


def _drain(queue_path: Path, stop: threading.Event) -> None:
    """A queue worker that completes whatever it claims (the coordinator's side is under test)."""
    with open_queue(queue_path) as queue:
        while not stop.is_set():
            lease = queue.claim("w0", lease_s=30)
            if lease is None:
                stop.wait(0.01)
                continue
            queue.ack(lease, f"results/{lease.request_id}")


def test_a_long_run_keeps_at_most_two_iterations_of_done_requests_in_the_queue(tmp_path, tmp_store, mem_ledger) -> None:
    queue_path = tmp_path / "queue.db"
    ctx = RunContext(
        "demo",
        "test",
        TrainConfig(),
        tmp_store,
        mem_ledger,
        None,
        str(tmp_path / "store"),
        queue_url=str(queue_path),
        sampling=Sampling(mode="workers", timeout_s=60),
    )
    stop = threading.Event()
    worker = threading.Thread(target=_drain, args=(queue_path, stop))
    worker.start()
    done_per_iteration = []
    try:
        with open_queue(queue_path) as queue:
            for k in range(8):
                requests = [
                    PlannedRequest(
                        request_id(k, p, 0),
                        p,
                        0,
                        RolloutSpec("demo", "a red circle", 100 * k + p, k, SamplerConfig(num_steps=2)),
                    )
                    for p in range(NUM_PROMPTS)
                ]
                sample_requests(ctx, k, requests)
                done_per_iteration.append(queue.stats().done)
            latest = queue.states([request_id(7, 0, 0), request_id(6, 0, 0), request_id(0, 0, 0)])
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not worker.is_alive(), "the draining worker did not stop within 60 s"
    assert done_per_iteration == [NUM_PROMPTS] + [2 * NUM_PROMPTS] * 7  # flat, not 8 x NUM_PROMPTS
    assert list(latest.values()) == ["done", "done", "unknown"]  # the last two iterations are still answered
