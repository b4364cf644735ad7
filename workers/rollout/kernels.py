"""Which kernels computed a rollout, and what a result computed on more than one kernel set is held to.

A request's noise is fixed by its seed, so two workers that run the same float operations in the same order commit
the same bits. What decides that order, beyond the code: the device type, torch's build, and on a CPU the vector
ISA of torch's kernels (`torch.backends.cpu.get_cpu_capability()`, forced with `ATEN_CPU_CAPABILITY`) and the
thread count (BLAS splits a matrix product by it: on an AMD EPYC, MKL's sgemm of 5 to 9 rows rounds differently on
1 and 2 threads). The kernel set names them. The contract (docs/SPOT_RUNTIME.md, "What bit-identical covers"):

- one kernel set, one processor model: a resumed result is bit-identical to an uninterrupted one (equal hashes);
- a result whose attempts ran on several kernel sets is recorded as such (`kernel_sets`, `mixed_kernels`): it is the
  same request sampled with other rounding, so its hash differs and its trajectory agrees with an uninterrupted run's
  within the drift the rounding grows to (MIXED_KERNELS_ATOL, measured below).

Example:
    me = {"worker_id": "w0", **kernel_labels(torch.device("cpu"))}   # {"device_type": "cpu", "kernel_set": ...}
    kernel_sets_of(attempts)                                         # ["AVX2, 1 threads, torch 2.13.0+cpu", ...]
"""

from __future__ import annotations

from typing import Any, Iterable

import torch

MIXED_KERNELS_ATOL = 1e-2
"""Largest difference allowed between a trajectory (latents, log-probs) computed on one kernel set and the same
request's computed partly or wholly on another. Measured between ATEN_CPU_CAPABILITY default, avx2 and avx512 on an
AMD EPYC (docs/log/kernel-sets.md), 8-step SDE rollouts: the tiny pixel policy 2.7e-3 on the latents (pixels in
[-1, 1]) and 1.2e-7 on the log-probs; the tiny Qwen-Image 1.2e-6 and 2.4e-7. 1e-2 leaves room for the drift to grow
over other seeds. A larger model, more steps or a GPU may drift further: the figure holds for what was measured."""


def kernel_set(device: torch.device | str, threads: int | None = None) -> str:
    """What decides the float bits of a forward on `device`, in words: e.g. "AVX512, 1 threads, torch 2.13.0+cpu",
    or "NVIDIA H100 80GB HBM3 sm_90, torch 2.13.0". `threads`: the torch thread count of the process that computes
    (default: this one's)."""
    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"{torch.cuda.get_device_name(device)} sm_{major}{minor}, torch {torch.__version__}"
    if device.type == "cpu":
        capability = torch.backends.cpu.get_cpu_capability()
        return f"{capability}, {threads or torch.get_num_threads()} threads, torch {torch.__version__}"
    return f"{device.type}, torch {torch.__version__}"


def cpu_identity() -> dict[str, str]:
    """What decides float bits on this CPU: torch's version, the vector ISA its kernels use, and the processor (its
    model name and a digest of its flags: two AVX512 machines of different models were seen to differ in every
    rollout hash; one MiniOCR base's 106-image reading moved by 0.005 between two AMD EPYCs, by 0.02 between
    AVX512 and AVX2 kernels on one). A run recorded under another identity is another run."""
    import hashlib
    import platform
    from pathlib import Path

    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    field = {line.split(":")[0].strip(): line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if ":" in line}
    return {
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "processor": field.get("model name", platform.processor()),
        "cpu_flags_sha1": hashlib.sha1(field.get("flags", "").encode()).hexdigest()[:12],
    }


def kernel_labels(device: torch.device | str, threads: int | None = None) -> dict[str, str]:
    """The labels a worker reports (its `ready` event) and stamps on every attempt it commits."""
    return {"device_type": torch.device(device).type, "kernel_set": kernel_set(device, threads)}


def kernel_sets_of(attempts: Iterable[dict[str, Any]]) -> list[str]:
    """The kernel sets that computed steps of a request, in order of first use (attempts that computed no step, or
    committed before workers stamped one, are left out)."""
    seen: list[str] = []
    for attempt in attempts:
        name = attempt.get("kernel_set")
        computed = attempt.get("committed_step", 0) > attempt.get("resumed_from_step", 0)
        if name is not None and computed and name not in seen:
            seen.append(name)
    return seen


def trajectory_drift(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between two results' latents and log-probs; NaN in both (an ODE step's log-prob)
    counts as equal, NaN in one only makes the drift NaN (beyond any tolerance)."""
    drifts = []
    for name in ("latents", "log_probs"):
        x, y = a[name], b[name]
        both_nan = x.isnan() & y.isnan()
        drifts.append(float(torch.where(both_nan, 0.0, x - y).abs().max()))
    return float("nan") if any(d != d for d in drifts) else max(drifts)
