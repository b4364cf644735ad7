"""A pool of rollout worker processes on this machine that lives for a whole run, preempted on a Poisson trace.

`spotlight run` (the default `--rollouts local_pool`) and `spotlight bench exploration`
start one; the phases then enqueue (rollouts, exploration beside training) and the pool's
workers pull. Worker ids carry a session number, so a resumed run's new workers stay
unique in the ledger.

Where the run saved its resolved config (`<run-dir>/config.yaml`), the pool hands each worker that file
(`--config`): the workers and the pool read the same knobs from it. The run's device decides where the workers
sample (resources/cluster/placement.py): on a CPU run `num_workers` CPU workers; on CUDA one worker per GPU the
trainer's ranks leave free, each pinned to its GPU (CUDA_VISIBLE_DEVICES), and none when the trainer holds them all
(the run then samples in-process: pipelines/run_defaults.py).

Example:
    with worker_pool(ctx, 2, 12.0, run_dir / "worker_logs", run_config=run_dir / "config.yaml"):
        for k in range(ctx.num_iterations + 1):
            run_iteration(ctx, k)
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Iterator

from resources.cluster import ClusterConfig, LocalCluster, WorkerSlot
from resources.cluster.placement import WorkerDevice, local_worker_devices
from resources.cluster.preemption import poisson_trace
from resources.ledger import Ledger
from workers.coordinator.context import RunContext
from workers.rollout.config import load_run_config

POOL_LIFETIME_S = 6 * 3600
"""Longest a pool runs (and the length of its preemption trace)."""
POOL_NICE = 10
"""The pool's workers share the trainer's machine: at this niceness they explore on the CPU time the trainer
leaves (on a cluster, the idle spot GPUs) instead of slowing its update. While the trainer waits for the
rollout, nothing competes and niceness changes nothing."""


def slot_name(index: int, session: int) -> str:
    """`w0`, `w1`, ... on the first start; `w0s1`, ... after a resume (worker ids stay unique in the ledger)."""
    return f"w{index}" if session == 0 else f"w{index}s{session}"


def pool_session(ledger: Ledger) -> int:
    """How many pools this run started before: 0 for a new run, 1 after the first --resume, ..."""
    slots = {r[0].split(".")[0] for r in ledger.query("SELECT worker_id FROM workers WHERE role = 'rollout'").rows}
    session = 0
    while slot_name(0, session) in slots:
        session += 1
    return session


def pool_devices(device: str, nproc: int, num_workers: int) -> list[WorkerDevice]:
    """Where each of the pool's workers samples, on this machine's GPUs (resources/cluster/placement.py)."""
    gpu_count = 0
    if device.startswith("cuda"):
        import torch

        gpu_count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return local_worker_devices(device, nproc, num_workers, gpu_count, os.environ)


@contextlib.contextmanager
def worker_pool(
    ctx: RunContext,
    num_workers: int,
    preemptions_per_hour: float,
    log_dir: Path | None,
    run_config: Path | None = None,
) -> Iterator[None]:
    """Start spot-priced workers pulling from the run's queue (`num_workers` on a CPU run, one per free GPU on CUDA:
    `pool_devices`); stop them when the block ends. With `run_config` (the run's saved config.yaml) the workers and
    the pool take their knobs (commit_every, lease_s, restart_delay_s, notice_share, spot_usd_per_hour, ...) and the
    device and trainer ranks from that file; without, from the run's sampling settings and device."""
    if ctx.queue_url is None:
        raise ValueError("a worker pool needs the run's queue: give the run a queue URL")
    saved = None if run_config is None else load_run_config(run_config)
    knobs = ctx.sampling if saved is None else saved.workers
    device, nproc = (ctx.device, 1) if saved is None else (saved.train.device, saved.train.nproc)
    session = pool_session(ctx.ledger)
    slots = [
        WorkerSlot(
            slot_name(i, session),
            spot=True,
            usd_per_hour=knobs.spot_usd_per_hour,
            device=place.device,
            visible_devices=place.visible_devices,
        )
        for i, place in enumerate(pool_devices(device, nproc, num_workers))
    ]
    if not slots:
        yield  # the trainer holds every GPU: it samples itself, or remote workers do (a Redis queue)
        return
    where = {"log_dir": None if log_dir is None else str(log_dir), "nice": POOL_NICE}
    if run_config is not None:
        config = ClusterConfig.for_run(ctx.queue_url, ctx.store_url, run_config, **where)
    else:
        config = ClusterConfig(
            ctx.queue_url,
            ctx.store_url,
            commit_every=knobs.commit_every,
            lease_s=knobs.lease_s,
            restart_delay_s=knobs.restart_delay_s,
            **where,
        )
    trace = poisson_trace(
        [s.name for s in slots],
        rate_per_hour=preemptions_per_hour,
        duration_s=POOL_LIFETIME_S,
        notice_share=knobs.notice_share,
        seed=session,
    )
    stop = threading.Event()
    cluster = LocalCluster(config, slots, ctx.ledger)
    cluster.start()
    pump = threading.Thread(
        target=cluster.run_until,
        args=(stop.is_set,),
        kwargs={"trace": trace, "timeout_s": POOL_LIFETIME_S},
        daemon=True,
    )
    pump.start()
    try:
        yield
    finally:
        stop.set()
        try:
            pump.join()
            cluster.stop()
        except KeyboardInterrupt:
            # Ctrl-C again while busy workers commit before they exit: end them now, then stop as asked.
            pump.join()
            cluster.stop(timeout_s=0.0)
            raise
