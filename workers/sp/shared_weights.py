"""Copy a policy's weights to a co-located process through shared memory instead of the tensor store.

CPU: the peer copies its state dict into one POSIX shared-memory segment (a file in
/dev/shm, so the bytes never leave RAM) and hands out a small `SharedWeights`
description (names, dtypes, shapes, offsets and the xxh3-128 weights hash); the joiner
maps the segment read-only, copies each tensor into its own parameters and checks the
hash. Nothing is pickled: the description is plain data and the payload raw bytes.
GPU (code path, not run on this CPU-only machine): `cuda_ipc_handles` exports CUDA IPC
handles of the peer's parameters and `copy_from_cuda_ipc` copies them device to device
(over NVLink when the peer sits on another GPU of the node).

Example:
    shared = export_weights(policy.state_dict(), name="spotlight-agent1-v3")   # peer
    import_weights(shared, joiner.state_dict())                                 # joiner
    unlink_segment(shared.segment)                                              # peer, once done
"""

from __future__ import annotations

import mmap
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from workers.pulse.weights_hash import weights_hash

_ALIGN = 64
"""Byte alignment of each tensor in the segment (any dtype view is then aligned)."""


class WeightsMismatchError(Exception):
    """The copied weights do not hash to the peer's weights hash."""


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    """torch dtype name without the prefix, e.g. 'float32'."""
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class SharedWeights:
    """Where a peer's weights sit in shared memory: plain data, safe to pass between processes."""

    segment: str
    """Path of the segment file (under /dev/shm on Linux)."""
    entries: tuple[TensorEntry, ...]
    weights_hash: str
    """xxh3-128 of the state dict (workers/pulse/weights_hash.py), checked by the importer."""
    nbytes: int


def shm_dir() -> Path:
    """/dev/shm where it exists (RAM-backed), else the temporary folder."""
    return Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def export_weights(state: Mapping[str, torch.Tensor], name: str, weights_hash_hex: str | None = None) -> SharedWeights:
    """Copy `state` into a new segment `name`; pass the known hash to skip hashing again."""
    if not name or "/" in name or name.startswith("."):
        raise ValueError(f"segment name {name!r} must be a plain file name")
    entries, offset = [], 0
    for key in sorted(state):
        t = state[key].detach()
        entries.append(
            TensorEntry(key, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, t.numel() * t.element_size())
        )
        offset += -(-entries[-1].nbytes // _ALIGN) * _ALIGN
    path = shm_dir() / name
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, max(offset, 1))
        with mmap.mmap(fd, max(offset, 1)) as mm:
            for entry in entries:
                _view(mm, entry).copy_(state[entry.name].detach().to("cpu"))
    except BaseException:
        os.unlink(path)
        raise
    finally:
        os.close(fd)
    digest = weights_hash_hex or weights_hash(state)
    return SharedWeights(str(path), tuple(entries), digest, offset)


def import_weights(shared: SharedWeights, target: Mapping[str, torch.Tensor]) -> str:
    """Copy the segment into `target`'s tensors (same names and shapes); return the checked hash."""
    missing = sorted(set(target) ^ {e.name for e in shared.entries})
    if missing:
        raise ValueError(f"the peer's weights and this model differ in tensors: {missing[:5]}")
    fd = os.open(shared.segment, os.O_RDONLY)
    try:
        with mmap.mmap(fd, max(shared.nbytes, 1), prot=mmap.PROT_READ) as mm:
            with torch.no_grad():
                for entry in shared.entries:
                    dst = target[entry.name]
                    if tuple(dst.shape) != entry.shape:
                        raise ValueError(f"{entry.name}: shape {tuple(dst.shape)} here, {entry.shape} at the peer")
                    dst.copy_(_view(mm, entry))
    finally:
        os.close(fd)
    digest = weights_hash(target)
    if digest != shared.weights_hash:
        raise WeightsMismatchError(f"weights hash {digest} after the copy, the peer has {shared.weights_hash}")
    return digest


def unlink_segment(path: str) -> None:
    """Remove a segment (the memory is freed once every mapping is closed)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _view(mm: mmap.mmap, entry: TensorEntry) -> torch.Tensor:
    raw = np.frombuffer(mm, dtype=np.uint8, count=entry.nbytes, offset=entry.offset)
    with warnings.catch_warnings():
        # A read-only mapping gives a non-writable array; the importer only reads from it.
        warnings.filterwarnings("ignore", message=".*not writable.*", category=UserWarning)
        return torch.from_numpy(raw).view(getattr(torch, entry.dtype)).reshape(entry.shape)


def cuda_ipc_handles(state: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """CUDA IPC handles of a peer's device tensors (GPU code path; unverified on this CPU machine)."""
    from torch.multiprocessing.reductions import reduce_tensor

    if any(t.device.type != "cuda" for t in state.values()):
        raise ValueError("cuda_ipc_handles needs every tensor on a CUDA device; use export_weights on CPU")
    return {name: reduce_tensor(t.detach()) for name, t in state.items()}


def copy_from_cuda_ipc(handles: Mapping[str, Any], target: Mapping[str, torch.Tensor]) -> None:
    """Open the peer's CUDA IPC handles and copy device to device (NVLink between GPUs of a node)."""
    with torch.no_grad():
        for name, (rebuild, args) in handles.items():
            target[name].copy_(rebuild(*args), non_blocking=True)
    torch.cuda.synchronize()
