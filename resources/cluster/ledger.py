"""What the local cluster learns from its workers' event streams, and the ledger rows it writes from them.

Workers never open the ledger (DuckDB admits one writing process): they print JSON
event lines, and the cluster process, the ledger's single writer, turns them into rows:
one `workers` row per process (labels and price), one `attempts` row per delivery of a
request (written when the attempt ends: one write per attempt keeps up with busy workers), one `preemptions` row
per preemption with the denoising work it cost, and at the end one `requests` row per result found in the store
(`record_results`). Progress is kept per worker id and `group`: an SP node (`python -m workers.sp`) is one worker
whose Ulysses groups and exploring members each run a request at once, and its events name the group.

Example:
    tracker = WorkTracker(ledger)
    tracker.worker_started("w0.0", role="rollout", instance_type="local-cpu", spot=True, usd_per_hour=0.4,
                           gpu_type=None, at=time.time())
    tracker.on_event(json.loads(line))                      # every line a worker prints
    record = tracker.preemption("w0.0", preempted_at, notice_s=0.0, ended_at=time.time())
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Iterable

from resources.keys import rollout_key
from resources.ledger import Ledger
from resources.ledger.records import AttemptRecord, PreemptionRecord, RequestRecord
from resources.store.base import TensorStore


@dataclass
class WorkerProgress:
    """The request one group of a worker holds and how far it got, from its events (a rollout worker is one group)."""

    request_id: str | None = None
    attempt: int = 0
    started_at: float = 0.0
    resumed_from_step: int = 0
    step: int = 0
    committed_step: int = 0
    uncommitted_s: list[float] = field(default_factory=list)
    """Seconds of each step computed since the last commit (lost if killed now)."""
    preempted_event: dict | None = None
    """The worker's own `preempted` event (SIGTERM path), if it printed one."""


class WorkTracker:
    """Per-(worker, group) progress from events; writes attempts and preemptions to the ledger (if any)."""

    def __init__(self, ledger: Ledger | None = None) -> None:
        self.ledger = ledger
        self.progress: dict[str, dict[str | None, WorkerProgress]] = {}
        """worker_id -> group -> progress. A rollout worker's events carry no group (None); an SP node's name the
        Ulysses group (`w0+w1`) or the exploring member (`w2`) that runs the request, several at once."""
        self.events: list[dict] = []
        self.preemptions: list[PreemptionRecord] = []
        self.started: set[str] = set()
        """Workers whose `workers` row this tracker wrote (their `ready` adds the kernel set to it)."""

    def worker_started(
        self,
        worker_id: str,
        *,
        role: str,
        instance_type: str,
        spot: bool,
        usd_per_hour: float,
        gpu_type: str | None,
        at: float,
        num_gpus: int | None = None,
    ) -> None:
        """`num_gpus`: the GPUs the worker holds (an SP node: one per device worker); None: 1 with a GPU type,
        else 0."""
        self.progress[worker_id] = {None: WorkerProgress()}
        self.started.add(worker_id)
        if num_gpus is None:
            num_gpus = 1 if gpu_type else 0
        if self.ledger is not None:
            self.ledger.start_worker(
                worker_id,
                role=role,
                instance_type=instance_type,
                spot=spot,
                gpu_type=gpu_type,
                num_gpus=num_gpus,
                usd_per_hour=usd_per_hour,
                at=at,
            )

    def worker_ended(self, worker_id: str, reason: str, at: float) -> None:
        if self.ledger is not None:
            self.ledger.end_worker(worker_id, reason=reason, at=at)

    def on_event(self, event: dict[str, Any]) -> None:
        """Update the progress of the sender's group; an attempt row is written when the attempt ends."""
        self.events.append(event)
        groups, group = self.progress.setdefault(event["worker_id"], {}), event.get("group")
        kind, t = event["event"], event["t"]
        if kind == "claim":
            _forget_elsewhere(groups, group, event["request_id"])
        elif kind in ("group_lost", "failed"):
            _forget_grouped(groups, group, event.get("request_id"))
            return
        if kind == "ready" and "kernel_set" in event and event["worker_id"] in self.started and self.ledger is not None:
            self.ledger.record_worker_kernels(
                event["worker_id"], device_type=event["device_type"], kernel_set=event["kernel_set"]
            )
        p = groups.setdefault(group, WorkerProgress())
        if kind == "claim":
            p.request_id, p.attempt, p.started_at = event["request_id"], event["attempt"], t
            p.resumed_from_step = p.step = p.committed_step = event["resumed_from_step"]
            p.uncommitted_s, p.preempted_event = [], None
        elif kind == "step":
            p.step = event["step"]
            p.uncommitted_s.append(event["step_s"])
        elif kind == "commit":
            p.committed_step, p.uncommitted_s = event["step"], []
        elif kind == "done":
            p.committed_step, p.uncommitted_s = p.step, []
            self._attempt(event["worker_id"], p, t_end=t, outcome="done")
            p.request_id = None
        elif kind == "preempted":
            p.preempted_event = event
            self._attempt(event["worker_id"], p, t_end=t, outcome="preempted")
        elif kind == "lost":
            self._attempt(event["worker_id"], p, t_end=t, outcome="lease_expired")
            p.request_id = None

    def preemption(self, worker_id: str, preempted_at: float, *, notice_s: float, ended_at: float) -> PreemptionRecord:
        """Record the preemption of a worker that has exited. Each request in flight on it (on an SP node, one per
        group) loses what it had not committed, nothing if it committed on the notice; its attempt row says how
        much, the preemption's row sums them and names the request when there was one."""
        lost_steps, lost_s, committed, in_flight = 0, 0.0, [], []
        for p in self.progress.get(worker_id, {}).values():
            if p.preempted_event is not None:  # committed on the notice: nothing lost
                committed.append(True)
            elif p.request_id is not None:  # killed mid-request: the steps since the last commit are lost
                lost_steps, lost_s = lost_steps + p.step - p.committed_step, lost_s + sum(p.uncommitted_s)
                committed.append(p.committed_step > 0)
                self._attempt(worker_id, p, t_end=ended_at, outcome="preempted")
            else:
                continue
            in_flight.append(p.request_id)
            p.request_id = None
        record = PreemptionRecord(
            worker_id=worker_id,
            preempted_at=preempted_at,
            notice_s=notice_s,
            steps_lost=lost_steps,
            state_committed=bool(committed) and all(committed),
            request_id=in_flight[0] if len(in_flight) == 1 else None,
            seconds_lost=lost_s,
        )
        self.preemptions.append(record)
        if self.ledger is not None:
            self.ledger.record_preemption(record)
        return record

    def preempted_t(self, worker_id: str) -> float | None:
        """When the worker first stopped a request on a SIGTERM or a notice (its `preempted` event), if it did."""
        times = [
            float(p.preempted_event["t"])
            for p in self.progress.get(worker_id, {}).values()
            if p.preempted_event is not None
        ]
        return min(times, default=None)

    def _attempt(self, worker_id: str, p: WorkerProgress, *, t_end: float | None, outcome: str) -> None:
        if self.ledger is None or p.request_id is None:
            return
        self.ledger.record_attempt(
            AttemptRecord(
                request_id=p.request_id,
                attempt=p.attempt,
                worker_id=worker_id,
                started_at=p.started_at,
                ended_at=t_end,
                outcome=outcome,
                resumed_from_step=p.resumed_from_step,
                steps_done=p.step - p.resumed_from_step,
                steps_lost=p.step - p.committed_step,
                seconds_lost=sum(p.uncommitted_s),
            )
        )


def _forget_elsewhere(groups: dict[str | None, WorkerProgress], group: str | None, request_id: str) -> None:
    """A request claimed on one group runs on no other group of that worker: an SP node resumes a request on its
    re-formed groups after a member was lost, and the group that stopped it holds it no longer."""
    for other in [g for g, p in groups.items() if g != group and p.request_id == request_id]:
        del groups[other]


def _forget_grouped(groups: dict[str | None, WorkerProgress], group: str | None, request_id: str | None) -> None:
    """An SP node's request stopped without an attempt end: its group was lost (`group_lost`, resumed later with a
    new claim) or it was given back (`failed`, printed without the group). A rollout worker's `failed` (no group)
    leaves its progress as it was: its next claim replaces it."""
    for other in [g for g, p in groups.items() if g is not None and (g == group or p.request_id == request_id)]:
        del groups[other]


def result_records(
    store: TensorStore, requests: Iterable[dict], *, enqueued_at: float | None = None
) -> list[RequestRecord]:
    """One `requests` row per rollout request whose result is committed in the store."""
    records = []
    for request in requests:
        payload = request["payload"]
        manifest = store.read_manifest(rollout_key(payload["run"], request["iteration"], request["request_id"]))
        if manifest is None:
            continue
        meta = manifest.metadata
        records.append(
            RequestRecord(
                request_id=request["request_id"],
                iteration=request["iteration"],
                kind=request["kind"],
                prompt=payload["prompt"],
                seed=payload["seed"],
                weights_version=payload["weights_version"],
                worker_id=meta.get("worker_id"),
                attempts=int(meta.get("attempt", 1)),
                result_hash=meta.get("result_hash"),
                reward=meta.get("reward"),
                enqueued_at=enqueued_at,
                finished_at=meta.get("finished_at"),
                kernel_sets=json.dumps(meta["kernel_sets"]) if "kernel_sets" in meta else None,
                mixed_kernels=bool(meta.get("mixed_kernels", False)),
            )
        )
    return records
