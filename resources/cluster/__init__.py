"""The local cluster: N rollout worker processes on this machine, preempted on a trace, capacity that comes back.

Each worker slot has an instance type, a spot/reserved flag and a price; the process in
it is `python -m workers.rollout` pulling from the shared queue (or its own queue, for a
static-assignment baseline). Local paths (queue, store, log folder) are made absolute when
the config is built, so a worker reads the same files whatever directory either process
runs in. A preemption trace (resources/cluster/preemption.py) SIGTERMs or SIGKILLs whatever
process holds a spot slot at each event time; `restart_delay_s` later
the slot gets a fresh process with a new worker id, as spot capacity returns. This
process is the ledger's single writer: worker starts and ends, attempts and preemptions
(with the denoising work each one cost) go there as they happen.

A cluster of a run hands every worker the run's saved config (`ClusterConfig.for_run`: `--config
<run-dir>/config.yaml`), so the workers and the cluster read their knobs from the one file; the knobs' defaults
are the config tree's (`WorkersSection`). A slot may name the worker's device (`--device`) and the one GPU it sees
(CUDA_VISIBLE_DEVICES): resources/cluster/placement.py plans one worker per GPU the trainer leaves.

Example:
    slots = [WorkerSlot("w0"), WorkerSlot("w1", spot=False)]
    cluster = LocalCluster(ClusterConfig.for_run(queue_url, store_url, run_dir / "config.yaml"), slots, ledger)
    with cluster:                                    # starts every slot, waits until they are ready
        summary = cluster.run_until(lambda: queue.stats().open == 0, trace=events, timeout_s=300)
"""

from __future__ import annotations

import contextlib
import json
import os
import queue as queue_mod
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from resources.cluster.config import ClusterConfig, WorkerSlot
from resources.cluster.ledger import WorkTracker
from resources.cluster.placement import VISIBLE_ENV
from resources.cluster.preemption import PreemptionEvent
from resources.ledger import Ledger
from resources.urls import PASSWORD_ENV, split_password


@dataclass
class _Process:
    worker_id: str
    slot: WorkerSlot
    popen: subprocess.Popen
    started_at: float
    ready: bool = False
    preempted_at: float | None = None
    notice_s: float = 0.0
    kill_at: float | None = None
    stopping: bool = False
    eof: bool = False


@dataclass
class ClusterSummary:
    """What one `run_until` saw."""

    wall_s: float
    completed: bool
    workers_started: int
    preemptions: list = field(default_factory=list)
    skipped_events: int = 0
    """Trace events that found their slot empty (its worker already gone)."""


class LocalCluster:
    """Worker subprocesses with preemption injection; writes the ledger if one is given."""

    def __init__(self, config: ClusterConfig, slots: Sequence[WorkerSlot], ledger: Ledger | None = None) -> None:
        names = [s.name for s in slots]
        if not slots or len(set(names)) != len(names):
            raise ValueError(f"a cluster needs at least one slot and unique slot names, got {names}")
        self.config, self.slots = config, {s.name: s for s in slots}
        self.tracker = WorkTracker(ledger)
        self._events: queue_mod.Queue = queue_mod.Queue()
        self._live: dict[str, _Process] = {}
        self._generation = {name: 0 for name in names}
        self._restart_at: dict[str, float] = {}
        self.workers_started = 0

    def __enter__(self) -> "LocalCluster":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Start every slot's worker and wait until all report ready."""
        for name in self.slots:
            self._spawn(name)
        deadline = time.monotonic() + self.config.ready_timeout_s
        while not all(p.ready for p in self._live.values()):
            if time.monotonic() > deadline:
                late = sorted(p.worker_id for p in self._live.values() if not p.ready)
                self.stop()
                raise RuntimeError(
                    f"workers {late} not ready after {self.config.ready_timeout_s:g} s (a busy machine?)"
                )
            self._pump(0.1)
        if len(self._live) < len(self.slots):
            self.stop()
            raise RuntimeError("a worker exited before it was ready; see its stderr (ClusterConfig.log_dir)")

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every worker (an idle one exits at once, a busy one commits first), SIGKILL those
        still alive after `timeout_s`, then take in every event they printed (the ledger stays complete)."""
        for proc in self._live.values():
            proc.stopping = True
            _signal(proc.popen, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for proc in list(self._live.values()):
            try:
                proc.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(proc.popen, signal.SIGKILL)
                proc.popen.wait()
        while self._live:  # every reader ends with None once its (exited) process's output is drained
            self._pump(1.0)
        self._restart_at.clear()

    def preempt(self, slot: str, notice_s: float = 0.0) -> bool:
        """Preempt the worker in `slot` now; False when the slot is empty or reserved."""
        proc = self._live.get(slot)
        if proc is None or not proc.slot.spot or proc.preempted_at is not None or proc.stopping:
            return False
        proc.preempted_at, proc.notice_s = time.time(), notice_s
        if notice_s > 0:
            _signal(proc.popen, signal.SIGTERM)
            proc.kill_at = time.monotonic() + notice_s
        else:
            _signal(proc.popen, signal.SIGKILL)
        return True

    def run_until(
        self,
        is_done: Callable[[], bool],
        *,
        trace: Sequence[PreemptionEvent] = (),
        timeout_s: float = 600.0,
        check_every_s: float = 0.25,
    ) -> ClusterSummary:
        """Replay `trace` (times from now) until `is_done()` or the timeout; restarts preempted slots."""
        started = time.monotonic()
        pending = sorted(trace)
        skipped, first_preemption = 0, len(self.tracker.preemptions)
        next_check = 0.0
        completed = False
        while time.monotonic() - started < timeout_s:
            now = time.monotonic() - started
            while pending and pending[0].time_s <= now:
                event = pending.pop(0)
                skipped += 0 if self.preempt(event.worker, event.notice_s) else 1
            self._tick()
            self._pump(0.05)
            if now >= next_check:
                next_check = now + check_every_s
                if is_done():
                    completed = True
                    break
        return ClusterSummary(
            time.monotonic() - started,
            completed,
            self.workers_started,
            self.tracker.preemptions[first_preemption:],
            skipped,
        )

    # --- internals -----------------------------------------------------------------------

    def _spawn(self, name: str) -> None:
        slot, cfg = self.slots[name], self.config
        worker_id = f"{name}.{self._generation[name]}"
        self._generation[name] += 1
        price = slot.price()
        queue_url, password = split_password(slot.queue_url or cfg.queue_url)  # the password stays off the argv
        command = [
            sys.executable,
            "-m",
            "workers.rollout",
            "--queue",
            queue_url,
            "--store",
            cfg.store_url,
            "--worker-id",
            worker_id,
            *(["--config", cfg.run_config] if cfg.run_config else knob_flags(cfg)),
            "--instance-type",
            slot.instance_type,
            "--spot" if slot.spot else "--reserved",
            "--usd-per-hour",
            str(price),
            "--threads",
            str(cfg.threads_per_worker),
            "--step-delay-s",
            str(slot.step_delay_s),
            *("--parent-pid", str(os.getpid())),  # the worker stops when this process is gone, however it ended
        ]
        if slot.gpu_type:
            command += ["--gpu-type", slot.gpu_type]
        if slot.device is not None:
            command += ["--device", slot.device]
        stderr = None
        if cfg.log_dir is not None:
            Path(cfg.log_dir).mkdir(parents=True, exist_ok=True)
            stderr = open(Path(cfg.log_dir) / f"{worker_id}.stderr", "w")
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(cfg.threads_per_worker),
            **({PASSWORD_ENV: password} if password else {}),
            **({VISIBLE_ENV: slot.visible_devices} if slot.visible_devices is not None else {}),
        }
        popen = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)
        if cfg.nice:
            with contextlib.suppress(OSError):  # the child exited already: its exit is handled like any other
                os.setpriority(os.PRIO_PROCESS, popen.pid, os.getpriority(os.PRIO_PROCESS, 0) + cfg.nice)
        if stderr is not None:
            stderr.close()  # the child holds its own descriptor
        at = time.time()
        self._live[name] = _Process(worker_id, slot, popen, at)
        self.workers_started += 1
        self.tracker.worker_started(
            worker_id,
            role="rollout",
            instance_type=slot.instance_type,
            spot=slot.spot,
            usd_per_hour=price,
            gpu_type=slot.gpu_type,
            at=at,
        )
        threading.Thread(target=_read_events, args=(worker_id, popen, self._events), daemon=True).start()

    def _tick(self) -> None:
        """Kill workers whose notice ran out; bring back capacity whose delay has passed."""
        now = time.monotonic()
        for proc in self._live.values():
            if proc.kill_at is not None and now >= proc.kill_at:
                _signal(proc.popen, signal.SIGKILL)
                proc.kill_at = None
        for name, at in list(self._restart_at.items()):
            if now >= at:
                del self._restart_at[name]
                self._spawn(name)

    def _pump(self, wait_s: float) -> None:
        """Hand worker events to the tracker for up to about `wait_s`; finish processes whose output ended.

        Time-boxed: busy workers emit events faster than a slow ledger may take them, and the
        trace must still fire on time."""
        deadline = time.monotonic() + wait_s
        try:
            item = self._events.get(timeout=wait_s)
        except queue_mod.Empty:
            return
        while True:
            worker_id, event = item
            proc = next((p for p in self._live.values() if p.worker_id == worker_id), None)
            if event is None:
                if proc is not None:
                    proc.popen.wait()
                    self._finish(proc, time.time())
            else:
                if proc is not None and event.get("event") == "ready":
                    proc.ready = True
                self.tracker.on_event(event)
            if time.monotonic() >= deadline:
                return
            try:
                item = self._events.get_nowait()
            except queue_mod.Empty:
                return

    def _finish(self, proc: _Process, at: float) -> None:
        if self._live.get(proc.slot.name) is not proc:
            return
        del self._live[proc.slot.name]
        if proc.preempted_at is not None:
            self.tracker.preemption(proc.worker_id, proc.preempted_at, notice_s=proc.notice_s, ended_at=at)
            self.tracker.worker_ended(proc.worker_id, "preempted", at)
            self._restart_at[proc.slot.name] = time.monotonic() + self.config.restart_delay_s
        else:
            clean = proc.popen.returncode == 0
            self.tracker.worker_ended(proc.worker_id, "finished" if clean else "failed", at)


def knob_flags(cfg: ClusterConfig) -> list[str]:
    """A worker's knob flags when the cluster has no run config file to hand it."""
    return ["--commit-every", str(cfg.commit_every), "--lease-s", str(cfg.lease_s)]


def _read_events(worker_id: str, popen: subprocess.Popen, sink: queue_mod.Queue) -> None:
    """Forward a worker's JSON event lines; None marks the end of its output."""
    for line in popen.stdout:
        try:
            sink.put((worker_id, json.loads(line)))
        except json.JSONDecodeError:
            continue  # not an event (a library printing to stdout)
    sink.put((worker_id, None))


def _signal(popen: subprocess.Popen, sig: int) -> None:
    if popen.poll() is None:
        try:
            popen.send_signal(sig)
        except ProcessLookupError:
            pass
