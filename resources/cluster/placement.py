"""Where a run's local rollout workers sample: on the CPU, or one worker per GPU the trainer leaves free.

A pure plan from the run's device, its trainer ranks and the GPUs this machine shows (the caller counts them with
torch): on `cpu` (or `mps`) every worker samples on that device; on `cuda` the trainer's ranks hold GPUs 0..nproc-1
(or the one `cuda:N` names), and each other GPU gets one worker, pinned to it by CUDA_VISIBLE_DEVICES (the worker
then sees one GPU, `cuda`, and can make no CUDA context on another). No GPU left: no worker, and the trainer's
own process samples (in-process rollouts).

Example:
    plan = local_worker_devices("cuda", nproc=1, num_workers=2, gpu_count=4)
    [(p.device, p.visible_devices) for p in plan]      # [("cuda", "1"), ("cuda", "2"), ("cuda", "3")]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class WorkerDevice:
    """Where one local worker samples."""

    device: str
    """The worker's --device."""
    visible_devices: Optional[str] = None
    """The worker's CUDA_VISIBLE_DEVICES (the one GPU it may use); None: this process's environment."""


def trainer_gpus(device: str, nproc: int) -> set[int]:
    """The GPU indices (as this process numbers them) the trainer's ranks use: rank r on GPU r, or `cuda:N` alone."""
    _, _, index = device.partition(":")
    return {int(index)} if index and nproc == 1 else set(range(nproc))


def free_gpus(device: str, nproc: int, gpu_count: int) -> list[int]:
    """The GPUs of this machine that the trainer leaves to rollout workers (none off CUDA)."""
    if not device.startswith("cuda"):
        return []
    busy = trainer_gpus(device, nproc)
    return [g for g in range(gpu_count) if g not in busy]


def local_worker_devices(
    device: str, nproc: int, num_workers: int, gpu_count: int, env: Optional[Mapping[str, str]] = None
) -> list[WorkerDevice]:
    """Each local worker's device: `num_workers` on a CPU (or MPS) run; on CUDA one per free GPU (`num_workers`
    counts CPU workers only: a GPU node's workers are its GPUs), none when the trainer holds every GPU. `env`: this
    process's environment, whose CUDA_VISIBLE_DEVICES (if set) maps our GPU indices to the ones a child sees."""
    if not device.startswith("cuda"):
        return [WorkerDevice(device) for _ in range(num_workers)]
    visible = _visible_list((env or {}).get(VISIBLE_ENV), gpu_count)
    return [WorkerDevice("cuda", visible[g]) for g in free_gpus(device, nproc, gpu_count)]


def _visible_list(value: Optional[str], gpu_count: int) -> list[str]:
    """Our GPU index -> the identifier a child's CUDA_VISIBLE_DEVICES names it by."""
    if not value:
        return [str(g) for g in range(gpu_count)]
    names = [v.strip() for v in value.split(",") if v.strip()]
    if len(names) < gpu_count:
        raise ValueError(f"{VISIBLE_ENV}={value!r} names {len(names)} GPU(s) but torch sees {gpu_count}")
    return names[:gpu_count]
