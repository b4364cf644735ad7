"""Simulated rollout GPUs: SimPy processes that pull from the real queue, form SP groups, and get preempted.

Each GPU slot holds one worker process at a time (`g3.0`, then `g3.1` after a preemption).
Free GPUs of a node are formed into SP groups by the real degree policy
(workers/sp/degree.py: `choose_sp_degree` over the node's free GPUs and the queue depth);
a group claims, works and acks through `SqliteQueue` on the simulated clock, so leases,
expiry, priorities, cancellation and at-least-once delivery are the real queue's.

A preemption with notice commits the request's state at the current step and releases the
lease (policy.commits), or gives the request back with nothing kept. Without notice the
work since the last commit (every `commit_every` steps) is lost and the request waits for
its lease to expire (workers renew a lease every third of it, as `LeaseKeeper` does). The
group's other GPUs re-form (elastic or from scratch); the preempted process ends `exit_s`
later (default: when the notice runs out) and the slot's replacement starts
`restart_delay_s` after that. A replayed run gives each worker id its own measured
start-up, restart and exit times (`WorkerTimes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import simpy

from resources.queue.records import Lease
from workers.sim.books import SimBooks
from workers.sim.config import SchedulingPolicy, SimConfig
from workers.sim.inputs import ServiceTimes, WorkerTimes
from workers.sp.degree import amdahl_latency_s, choose_sp_degree


@dataclass
class Slot:
    name: str
    node: int
    generation: int = 0
    state: str = "starting"
    """starting, free, busy (in a group) or down (preempted, replacement pending)."""
    group: "Group | None" = None
    process: simpy.Process | None = None

    @property
    def worker_id(self) -> str:
        return f"{self.name}.{self.generation}"


@dataclass
class Group:
    worker_id: str
    node: int
    members: list[Slot]
    degree: int
    process: simpy.Process | None = None
    busy_s: float = 0.0


@dataclass
class Work:
    """What the cluster reports to the coordinator."""

    finished: dict[str, tuple[str, int, float, float]] = field(default_factory=dict)
    """request id -> (worker id, attempts, enqueued_at, finished_at)."""
    compute_s: dict[str, float] = field(default_factory=dict)
    """request id -> seconds of the attempt that finished it (what a worker reports as its compute time)."""
    busy_gpu_s: float = 0.0
    lost_gpu_s: float = 0.0


class SimCluster:
    def __init__(
        self,
        env: simpy.Environment,
        queues: dict,
        books: SimBooks,
        times: ServiceTimes,
        config: SimConfig,
        slots: list[Slot],
        usd_per_gpu_hour: float,
        price_source: str,
        worker_times: Mapping[str, WorkerTimes] | None = None,
    ) -> None:
        self.env, self.queues, self.books, self.times, self.config = env, queues, books, times, config
        self.worker_times = dict(worker_times or {})
        self.policy: SchedulingPolicy = config.policy
        self.slots = {s.name: s for s in slots}
        self.usd, self.price_source = usd_per_gpu_hour, price_source
        self.wake = {key: env.event() for key in queues}
        self.committed: dict[str, int] = {}
        self.enqueued_at: dict[str, float] = {}
        self.work = Work()
        self.on_done = None  # callback(request_id, kind) set by the engine
        self.degree: dict[int, int] = {}

    # --- queue plumbing ------------------------------------------------------------------

    def queue_for(self, node: int):
        return self.queues["all"] if "all" in self.queues else self.queues[node]

    def notify(self, key) -> None:
        event, self.wake[key] = self.wake[key], self.env.event()
        event.succeed()

    def notify_all(self) -> None:
        for key in list(self.wake):
            self.notify(key)

    def _wake_at(self, key, at: float) -> None:
        def later():
            yield self.env.timeout(max(0.0, at - self.env.now) + 1e-6)
            self.notify(key)

        self.env.process(later())

    # --- slot lifecycle ------------------------------------------------------------------

    def start_all(self) -> None:
        for slot in self.slots.values():
            slot.state = "down"
            self.env.process(self._start_after(slot, self._measured(slot.worker_id, "restart_delay_s", 0.0)))

    def _measured(self, worker_id: str, name: str, default: float) -> float:
        value = getattr(self.worker_times.get(worker_id), name, None)
        return default if value is None else value

    def _start_after(self, slot: Slot, delay_s: float):
        if delay_s > 0:
            yield self.env.timeout(delay_s)
        startup = self.times.startup_s if slot.generation == 0 else self._replacement_startup_s(slot)
        self.books.worker_start(
            slot.worker_id,
            role="rollout",
            spot=self.policy.spot,
            usd_per_hour=self.usd,
            gpu_type=self.times.gpu_type,
            t=self.env.now,
            source=self.price_source,
        )
        slot.state = "starting"
        slot.process = self.env.process(self._boot(slot, self._measured(slot.worker_id, "startup_s", startup)))

    def _boot(self, slot: Slot, startup_s: float):
        try:
            yield self.env.timeout(startup_s)
        except simpy.Interrupt:
            return
        slot.state, slot.process = "free", None
        self.form_groups(slot.node)

    def _replacement_startup_s(self, slot: Slot) -> float:
        t = self.times
        peers = [s for s in self.slots.values() if s.node == slot.node and s.state in ("free", "busy")]
        if self.policy.elastic_sp and peers:
            return max(0.0, t.startup_s - t.model_load_s) + t.weight_copy_s
        return t.startup_s

    def preempt(self, name: str, notice_s: float) -> None:
        """A trace event: preempt whatever process holds slot `name` now (dropped if it is down)."""
        slot = self.slots.get(name)
        if slot is None or slot.state == "down":
            return
        worker_id, now = slot.worker_id, self.env.now
        if slot.group is not None:
            self._break_group(slot.group, slot, notice_s)  # the group records the preemption
        else:
            if slot.state == "starting" and slot.process is not None:
                slot.process.interrupt("preempted")
            self._idle_preemption(worker_id, notice_s)
        slot.state, slot.group = "down", None
        exit_s = notice_s if self.times.exit_s is None else min(self.times.exit_s, notice_s or self.times.exit_s)
        end = now + self._measured(worker_id, "exit_s", exit_s)
        self.books.worker_end(worker_id, "preempted", end)
        slot.generation += 1
        restart_s = self._measured(slot.worker_id, "restart_delay_s", self.times.restart_delay_s)
        self.env.process(self._start_after(slot, end - now + restart_s))

    def _idle_preemption(self, worker_id: str, notice_s: float) -> None:
        self.books.add(
            "preemptions",
            worker_id=worker_id,
            preempted_at=self.env.now,
            notice_s=notice_s,
            request_id=None,
            steps_lost=0,
            seconds_lost=0.0,
            state_committed=False,
        )

    # --- SP groups -----------------------------------------------------------------------

    def latency_s(self, degree: int) -> float:
        t = self.times
        return amdahl_latency_s(t.sample_s, degree, t.sp_parallel_fraction, t.sp_comm_s * t.num_steps)

    def form_groups(self, node: int) -> None:
        """Group the node's free GPUs at the degree the real policy picks for the current queue depth."""
        free = [s for s in self.slots.values() if s.node == node and s.state == "free"]
        degrees = [
            d for d in (1, 2, 4, 8) if self.times.min_sp_degree <= d <= min(len(free), self.config.gpus_per_node)
        ]
        if not degrees:
            return
        depth = self.queue_for(node).stats().open
        reform = self.times.elastic_reform_s if self.policy.elastic_sp else self.times.model_load_s
        choice = choose_sp_degree(
            len(free),
            depth,
            {d: self.latency_s(d) for d in degrees},
            current_degree=self.degree.get(node),
            reform_s=reform,
        )
        self.degree[node] = choice.degree
        for i in range(choice.num_groups):
            members = free[i * choice.degree : (i + 1) * choice.degree]
            group = Group(members[0].worker_id, node, members, choice.degree)
            for s in members:
                s.state, s.group = "busy", group
            group.process = self.env.process(self._group_loop(group))

    def _break_group(self, group: Group, victim: Slot, notice_s: float) -> None:
        """Stop the group (its request's fate depends on notice and commits); its other GPUs re-form."""
        group.process.interrupt(("preempted", victim.worker_id, notice_s, {}))
        survivors = [s for s in group.members if s is not victim]
        reform = self.times.elastic_reform_s if self.policy.elastic_sp else self.times.model_load_s
        for s in survivors:
            s.state, s.group = "starting", None
        if survivors:
            self.env.process(self._reform(survivors, reform))

    def _reform(self, members: list[Slot], reform_s: float):
        yield self.env.timeout(reform_s)
        ready = [s for s in members if s.state == "starting" and s.process is None]
        for s in ready:
            s.state = "free"
        if ready:
            self.form_groups(ready[0].node)

    def _group_loop(self, group: Group):
        key = "all" if "all" in self.queues else group.node
        queue = self.queue_for(group.node)
        try:
            while True:
                lease = queue.claim(group.worker_id, self.config.lease_s)
                if lease is None:
                    yield self.wake[key]
                    continue
                yield from self._serve(group, queue, lease, key)
        except simpy.Interrupt as stop:
            _, victim, notice_s, outcome = stop.cause
            if not outcome.get("recorded"):
                self._idle_preemption(victim, notice_s)

    def _serve(self, group: Group, queue, lease: Lease, key):
        payload = lease.request.payload
        steps, rid = int(payload["steps"]), lease.request_id
        step_s = float(payload["step_s"]) * self.latency_s(group.degree) / self.times.sample_s
        claim_s = float(payload.get("claim_s", self.times.claim_s))
        start_step = self.committed.get(rid, 0) if self.policy.commits else 0
        t0 = self.env.now
        total = claim_s + (steps - start_step) * step_s
        done_s, beat = 0.0, self.env.now
        try:
            while done_s < total:
                chunk = min(total - done_s, self.config.lease_s / 3)
                yield self.env.timeout(chunk)
                done_s += chunk
                if done_s < total:
                    if not queue.heartbeat(lease):
                        self._attempt(lease, group, t0, "lease_expired", start_step, None)
                        return
                    beat = self.env.now
        except simpy.Interrupt as stop:
            _, victim, notice_s, outcome = stop.cause
            elapsed = max(0.0, self.env.now - t0 - claim_s)
            reached = min(steps, start_step + int(elapsed / step_s))
            self._interrupted(
                group, queue, lease, key, (victim, notice_s, outcome), start_step, reached, step_s, beat, t0
            )
            raise
        self.work.busy_gpu_s += total * group.degree
        self._attempt(lease, group, t0, "done", start_step, steps)
        if queue.ack(lease, f"sim/{rid}"):
            self.work.finished[rid] = (group.worker_id, lease.attempts, self.enqueued_at.get(rid, t0), self.env.now)
            self.work.compute_s[rid] = self.env.now - t0
            if self.on_done is not None:
                self.on_done(rid, lease.request.kind)

    def _interrupted(self, group, queue, lease, key, why, start_step, reached, step_s, beat, t0) -> None:
        victim, notice_s, outcome = why
        c = self.config.commit_every
        if not self.policy.commits:
            keep = 0
        elif notice_s > 0:
            keep = reached  # commit on notice
        else:
            keep = max(start_step, (reached // c) * c)
        if self.policy.commits:
            self.committed[lease.request_id] = keep
        lost = reached - keep if self.policy.commits else reached
        self.work.lost_gpu_s += lost * step_s * group.degree
        self.work.busy_gpu_s += (self.env.now - t0) * group.degree
        if notice_s > 0:
            queue.release(lease)
            self.notify(key)
        else:
            self._wake_at(key, beat + self.config.lease_s)
        self._attempt(lease, group, t0, "preempted", start_step, reached)
        self.books.add(
            "preemptions",
            worker_id=victim,
            preempted_at=self.env.now,
            notice_s=notice_s,
            request_id=lease.request_id,
            steps_lost=lost,
            seconds_lost=lost * step_s,
            state_committed=self.policy.commits and keep > 0,
        )
        outcome["recorded"] = True

    def _attempt(self, lease: Lease, group: Group, t0: float, outcome: str, start_step: int, steps_done) -> None:
        self.books.add(
            "attempts",
            request_id=lease.request_id,
            attempt=lease.attempts,
            worker_id=group.worker_id,
            started_at=t0,
            ended_at=self.env.now,
            outcome=outcome,
            resumed_from_step=start_step,
            steps_done=steps_done,
        )

    def live_groups(self) -> int:
        return len({id(s.group) for s in self.slots.values() if s.group is not None})

    def alive_workers(self) -> int:
        """Worker processes alive now (an SP group is one; starting and idle GPUs count one each), as the real
        coordinator counts the ledger's open rollout workers to size exploration."""
        return self.live_groups() + sum(s.state in ("starting", "free") for s in self.slots.values())
