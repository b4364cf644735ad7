"""xxh3-128 identity of a set of weights, and the BF16 views PULSE compares."""

from __future__ import annotations

import struct
from collections.abc import Mapping

import numpy as np
import torch
import xxhash


def weights_hash(weights: Mapping[str, torch.Tensor]) -> str:
    """xxh3-128 hex digest over sorted names, shapes, dtypes and raw bytes.

    Every field is length-prefixed, so no two different weight sets share an input.
    Tensors on an accelerator are copied to the host first.
    """
    digest = xxhash.xxh3_128()
    for name in sorted(weights):
        tensor = weights[name].detach()
        meta = f"{name}\0{tuple(tensor.shape)}\0{tensor.dtype}".encode()
        raw = tensor_bytes(tensor)
        digest.update(struct.pack("<QQ", len(meta), raw.nbytes))
        digest.update(meta)
        digest.update(raw)
    return digest.hexdigest()


def tensor_bytes(tensor: torch.Tensor) -> np.ndarray:
    """The tensor's raw bytes as a flat uint8 numpy view (a copy only if needed)."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy()


def as_bf16(tensor: torch.Tensor, name: str) -> torch.Tensor:
    """BF16 tensor exactly as the forward pass sees it: FP32 is cast with .to(bfloat16)."""
    if tensor.dtype == torch.bfloat16:
        return tensor.detach()
    if tensor.dtype == torch.float32:
        return tensor.detach().to(torch.bfloat16)
    raise ValueError(f"tensor {name!r} has dtype {tensor.dtype}; PULSE patches carry bfloat16 (or float32 cast to it)")


def bf16_bits(tensor: torch.Tensor) -> np.ndarray:
    """Flat int16 numpy view of a BF16 tensor's bit patterns (host copy if on a device)."""
    return tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.int16).numpy()
