"""The node agent's product path: leased rollout requests sampled on its SP groups by the rollout worker's own code.

One thread per group runs `work_request` (workers/rollout/request.py) on one leased request at a time, with the
group as its policy holder (workers/sp/group_policy.py). So a request served here is committed exactly as a
rollout worker commits it: in-flight state every `commit_every` steps under the attempt's own key, the result
exclusively under the request id, the same events. Leases are kept alive from claim to ack (LeaseKeeper).

A lost member ends the round: its group's request unwinds (GroupLost) with its last commit in the store; every
other group is asked to stop at its next step boundary, which commits its state at once (the rollout worker's
preemption path, so no step is lost); the agent then re-forms the survivors and the requests resume from their
commits. A request the policy cannot serve (a bad field, a degree that does not divide, weights the store lacks)
is given back with a `failed` event, as a rollout worker gives it back; one of a run on another model than the
node's `--model` also stops the node (`misconfigured`), as it stops a rollout worker.

Exploration requests run after the round's rollouts, one per member at degree 1 (workers/sp/node_explore.py).

Example:
    server = RequestServer(agent, queue, store, report, ServeConfig(node_id="node0"), stop_event)
    server.serve(leases)            # returns once every lease is acked, given back or lost
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import ExitStack
from dataclasses import dataclass, field

from resources.queue.keepalive import LeaseKeeper
from resources.queue.records import Lease
from resources.store.base import StoreError
from workers.rollout.config import KNOBS
from workers.rollout.request import StepHooks, work_request
from workers.rollout.state import RolloutSpec
from workers.rollout.weights import ModelMismatchError
from workers.sp.degree import amdahl_latency_s, choose_sp_degree
from workers.sp.group_policy import GroupChannel, GroupHolder, GroupLost
from workers.sp.node_explore import serve_explore

REQUEST_ERRORS = (ValueError, LookupError, StoreError)


@dataclass(frozen=True)
class ServeConfig:
    node_id: str
    """This agent's name in the events and in the attempts' records."""
    commit_every: int = KNOBS.commit_every
    """Denoising steps between committed states of an in-flight request."""
    degree: int | None = None
    """Groups of this many workers (fewer once too few are left); None: per round, by the degree policy."""
    step_delay_s: float = 0.0
    """Extra seconds per step (simulates a slower device locally)."""

    def __post_init__(self):
        if self.commit_every < 1:
            raise ValueError(f"commit_every must be >= 1, got {self.commit_every}")
        if self.degree is not None and self.degree < 1:
            raise ValueError(f"degree must be >= 1 or None, got {self.degree}")


@dataclass
class _Round:
    """What the group threads of one round share (under `lock`)."""

    pending: deque
    again: list
    """Jobs to resume once the groups re-form (their state is committed)."""
    regroup: threading.Event
    """Set when a group is lost: every group stops at its next step."""
    lock: threading.Lock
    errors: list
    """Unexpected exceptions of the group threads, raised again in the agent's thread."""


@dataclass
class _Job:
    lease: Lease
    keeper: LeaseKeeper
    spec: RolloutSpec
    degrees: list[int] = field(default_factory=list)
    """SP degrees its policy can be split into (from a member's probe)."""


class RequestServer:
    def __init__(self, agent, queue, store, report, config: ServeConfig, stop: threading.Event):
        self.agent, self.queue, self.store, self.report, self.config = agent, queue, store, report, config
        self.stop = stop
        self.degree = 0
        """Degree of the current groups (0: none formed yet)."""
        self._degrees: dict[tuple, list[int]] = {}
        self.misconfigured = False
        """Set when a run trains another model than the node's --model: the node stops instead of claiming on."""

    def serve(self, leases: list[Lease]) -> None:
        """Work every lease until it is acked, given back (failed, or the node is stopping) or lost: the rollouts
        on the groups first (they are claimed first), then the exploration requests, one per member."""
        with ExitStack() as keepers:
            explore = [lease for lease in leases if lease.request.kind == "explore"]
            for lease in explore:  # alive while the rollouts go first
                keepers.enter_context(LeaseKeeper(self.queue, lease))
            jobs = [
                job
                for job in (self._admit(lease, keepers) for lease in leases if lease.request.kind != "explore")
                if job is not None
            ]
            while jobs and not self.stop.is_set():
                degree = self._choose_degree(jobs)
                jobs = [job for job in jobs if self._fits(job, degree)]
                if jobs:
                    self._form(degree)
                    jobs = self._run_round(jobs)
            for job in jobs:  # stopping: each was committed by its group at the stop
                self.queue.release(job.lease)
            serve_explore(
                self.agent,
                self.queue,
                self.report,
                explore,
                node_id=self.config.node_id,
                stop=self.stop,
                give_back=self._give_back,
            )

    # ----- admission and degree -----
    def _admit(self, lease: Lease, keepers: ExitStack) -> _Job | None:
        if lease.request.kind != "rollout":  # validation requests: another role, as for a rollout worker
            self.report("skipped", request_id=lease.request_id, kind=lease.request.kind)
            self.queue.release(lease)
            return None
        keeper = keepers.enter_context(LeaseKeeper(self.queue, lease))
        try:
            spec = RolloutSpec.from_payload(lease.request.payload)
            degrees = self._probe(spec)
        except REQUEST_ERRORS as err:
            self._give_back(lease, err)
            return None
        return _Job(lease, keeper, spec, degrees)

    def _probe(self, spec: RolloutSpec) -> list[int]:
        """The degrees a member finds for the request's policy (cached per run, resolution and guidance: the text
        length that also counts is the family's fixed one, or padded)."""
        key = (spec.run, spec.resolution, spec.guidance)
        while key not in self._degrees:
            self.agent.forget_dead()
            live = self.agent.live_loaded()
            if not live:
                raise RuntimeError("every device worker of the node is lost")
            channel = GroupChannel([self.agent.workers[live[0]]], self.agent.config.reply_timeout_s)
            try:
                reply = channel.call({"op": "probe", "payload": spec.to_payload(), "max_degree": len(live)})
            except GroupLost:
                continue  # that worker died: ask another
            self._degrees[key] = list(reply["degrees"])
        return self._degrees[key]

    def _choose_degree(self, jobs: list[_Job]) -> int:
        self.agent.forget_dead()
        workers = len(self.agent.live_loaded())
        if workers == 0:
            raise RuntimeError("every device worker of the node is lost")
        common = sorted(set.intersection(*(set(j.degrees) for j in jobs)) & set(range(1, workers + 1)))
        if self.config.degree is not None:
            return min(self.config.degree, max(common))  # fewer workers left than asked: the largest that fits
        single = self.agent.latency_s.get(1, 1.0)
        latency = {d: self.agent.latency_s.get(d, amdahl_latency_s(single, d)) for d in common}
        return choose_sp_degree(workers, len(jobs), latency, current_degree=self.degree or None, reform_s=0.5).degree

    def _fits(self, job: _Job, degree: int) -> bool:
        """A job whose policy cannot be split `degree` ways (only with a fixed --degree) is given back."""
        if degree in job.degrees:
            return True
        self._give_back(
            job.lease,
            ValueError(
                f"SP degree {degree} cannot split run {job.spec.run!r} at resolution "
                f"{job.spec.resolution or 'default'}: possible degrees {job.degrees}"
            ),
        )
        return False

    def _form(self, degree: int) -> None:
        if degree == self.degree and all(self.agent.workers[w].proc.is_alive() for g in self.agent.groups for w in g):
            return
        report = self.agent.form(degree)
        self.degree = degree
        self.report(
            "formed", generation=report.generation, degree=degree, groups=report.groups, reform_s=report.total_s
        )

    # ----- a round: one thread per group -----
    def _run_round(self, jobs: list[_Job]) -> list[_Job]:
        """Serve jobs on the current groups until done or a group is lost; returns the jobs left to resume."""
        round_ = _Round(deque(jobs), [], threading.Event(), threading.Lock(), [])
        threads = [
            threading.Thread(
                target=self._group_loop, args=(members, round_), name=f"group-{'+'.join(members)}", daemon=True
            )
            for members in self.agent.groups
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if round_.errors:
            raise round_.errors[0]
        if round_.regroup.is_set():
            self.degree = 0  # re-form, even at the same degree: a group is broken
        return round_.again + list(round_.pending)

    def _group_loop(self, members: list[str], round_: "_Round") -> None:
        holder = GroupHolder(GroupChannel([self.agent.workers[w] for w in members], self.agent.config.reply_timeout_s))
        while not round_.regroup.is_set() and not self.stop.is_set():
            with round_.lock:
                if not round_.pending:
                    return
                job = round_.pending.popleft()
            try:
                resume = self._work(job, holder, round_.regroup)
            except BaseException as err:  # surfaced by _run_round in the agent's thread, not lost with this one
                round_.errors.append(err)
                round_.regroup.set()
                resume = True
            if resume:
                with round_.lock:
                    round_.again.append(job)

    def _work(self, job: _Job, holder: GroupHolder, regroup: threading.Event) -> bool:
        """One attempt at a job on one group; True when it must resume after the groups re-form."""
        group = "+".join(holder.channel.members)
        hooks = StepHooks(
            should_stop=lambda: regroup.is_set() or self.stop.is_set(),
            lease_lost=lambda: job.keeper.lost,
            report=lambda event, **fields: self.report(event, group=group, **fields),
            step_delay_s=self.config.step_delay_s,
        )
        started = time.perf_counter()
        try:
            outcome = work_request(
                job.lease.request,
                job.lease.attempts,
                self.store,
                holder,
                worker_id=f"{self.config.node_id}/{group}",
                commit_every=self.config.commit_every,
                hooks=hooks,
            )
        except GroupLost as lost:
            regroup.set()
            self.report("group_lost", request_id=job.lease.request_id, group=group, dead=lost.dead, error=lost.error)
            if lost.dead:
                return True
            self._give_back(job.lease, lost)  # every member alive, yet a collective failed: not the node's loss
            return False
        except REQUEST_ERRORS as err:
            self._give_back(job.lease, err)
            return False
        if outcome.status in ("done", "already_done"):
            first = self.queue.ack(job.lease, outcome.result_key)
            self.report("acked", request_id=job.lease.request_id, first=first, attempt=job.lease.attempts, group=group)
            self._record_latency(len(holder.channel.members), time.perf_counter() - started, outcome)
        return outcome.status == "preempted"  # committed at the stop: resumed after the re-form, or released

    def _give_back(self, lease: Lease, err: Exception) -> None:
        self.report("failed", request_id=lease.request_id, error=f"{type(err).__name__}: {err}")
        self.queue.release(lease)
        if isinstance(err, ModelMismatchError):  # every request of that run would fail here
            self.misconfigured = True
            self.stop.set()

    def _record_latency(self, degree: int, seconds: float, outcome) -> None:
        """Seconds per request at a degree, for the degree policy (only requests run start to end here)."""
        if outcome.status != "done" or outcome.resumed_from_step != 0:
            return
        old = self.agent.latency_s.get(degree)
        self.agent.latency_s[degree] = seconds if old is None else 0.8 * old + 0.2 * seconds
