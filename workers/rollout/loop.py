"""The rollout worker's claim loop: claim, keep the lease alive, work the request, ack or give it back.

Rollout requests and, when no rollout or validation is waiting, exploration requests
(`workers/explore/request.py`: cheap sampling of candidate seeds on stale weights).

Example:
    loop = WorkerLoop(queue, store, config, stop_event, report)   # config: workers.rollout.config.WorkerConfig
    reason = loop.run()                                         # "stopped", "idle" or "misconfigured"
"""

from __future__ import annotations

import threading
import time

from resources.queue.base import QueueUnavailableError, RequestQueue
from resources.queue.keepalive import LeaseKeeper
from resources.queue.records import Lease
from resources.store.base import StoreError, TensorStore
from workers.explore.request import work_explore_request
from workers.rollout.config import WorkerConfig
from workers.rollout.kernels import kernel_labels
from workers.rollout.request import StepHooks, check_run_reward, work_request
from workers.rollout.weights import ModelMismatchError, PolicyHolder


class WorkerLoop:
    """One worker: pulls requests until told to stop (SIGTERM, a cloud notice) or idle too long."""

    def __init__(
        self, queue: RequestQueue, store: TensorStore, config: WorkerConfig, stop: threading.Event, report
    ) -> None:
        import torch

        if config.threads is not None:
            torch.set_num_threads(config.threads)
        from diffusers import QwenImageTransformer2DModel  # noqa: F401  (import now: "ready" means ready to sample)

        self.queue, self.store, self.config, self.stop, self.report = queue, store, config, stop, report
        self.holder = PolicyHolder(
            store, device=config.device, model=config.model, resident_dtype=config.resident_dtype
        )
        self.misconfigured = False
        """Set when a run trains another model than --model: the worker stops (exit 2) instead of claiming on."""
        self.labels = {
            "instance_type": config.instance_type,
            "gpu_type": config.gpu_type,
            "spot": config.spot,
            "usd_per_hour": config.usd_per_hour,
            **kernel_labels(config.device),  # after set_num_threads: the thread count is part of a CPU's kernel set
        }

    def run(self) -> str:
        self.report(
            "ready", pid=_pid(), commit_every=self.config.commit_every, lease_s=self.config.lease_s, **self.labels
        )
        idle_since = time.monotonic()
        while not self.stop.is_set():
            lease = self._claim()
            if lease is None:
                if self.config.max_idle_s is not None and time.monotonic() - idle_since >= self.config.max_idle_s:
                    return "idle"
                self.stop.wait(self.config.poll_s)
                continue
            self._work(lease)
            idle_since = time.monotonic()
        return "misconfigured" if self.misconfigured else "stopped"

    def _claim(self) -> Lease | None:
        try:
            return self.queue.claim(self.config.worker_id, self.config.lease_s)
        except QueueUnavailableError as err:
            self.report("queue_unavailable", error=str(err))
            return None

    def _work(self, lease: Lease) -> None:
        if lease.request.kind == "explore":
            self._explore(lease)
            return
        if lease.request.kind != "rollout":
            # Validation workers are another role; hand it back for them.
            self.report("skipped", request_id=lease.request_id, kind=lease.request.kind)
            self.queue.release(lease)
            return
        with LeaseKeeper(self.queue, lease) as keeper:
            hooks = StepHooks(
                should_stop=self.stop.is_set,
                lease_lost=lambda: keeper.lost,
                report=self.report,
                step_delay_s=self.config.step_delay_s,
            )
            try:
                outcome = work_request(
                    lease.request,
                    lease.attempts,
                    self.store,
                    self.holder,
                    worker_id=self.config.worker_id,
                    commit_every=self.config.commit_every,
                    hooks=hooks,
                )
            except (ValueError, LookupError, StoreError) as err:
                # A malformed request or missing weights: give it back; after max_deliveries it is a dead letter.
                self._give_back(lease, err)
                return
        if outcome.status in ("done", "already_done"):
            first = self.queue.ack(lease, outcome.result_key)
            self.report("acked", request_id=lease.request_id, first=first, attempt=lease.attempts)
        elif outcome.status == "preempted":
            self.queue.release(lease)

    def _explore(self, lease: Lease) -> None:
        """An exploration request: one short batch on stale weights, not worth committing state for.
        If the coordinator cancelled it meanwhile, the ack is refused and the result simply goes unused."""
        if self.stop.is_set():
            self.queue.release(lease)
            return
        with LeaseKeeper(self.queue, lease):
            try:
                check_run_reward(
                    self.store, lease.request.payload.get("run", ""), lease.request.payload.get("reward", "")
                )
                outcome = work_explore_request(
                    lease.request,
                    self.store,
                    self.holder,
                    worker_id=self.config.worker_id,
                    attempt=lease.attempts,
                    report=self.report,
                )
            except (ValueError, LookupError, StoreError) as err:
                self._give_back(lease, err)
                return
        first = self.queue.ack(lease, outcome.result_key)
        self.report("acked", request_id=lease.request_id, first=first, attempt=lease.attempts)

    def _give_back(self, lease: Lease, err: Exception) -> None:
        """Report why a request failed here and release it; a run on another model than --model stops the worker
        (every request of that run would fail here)."""
        self.report("failed", request_id=lease.request_id, error=f"{type(err).__name__}: {err}")
        self.queue.release(lease)
        if isinstance(err, ModelMismatchError):
            self.misconfigured = True
            self.stop.set()


def _pid() -> int:
    import os

    return os.getpid()
