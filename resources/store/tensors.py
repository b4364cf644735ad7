"""Tensor dicts <-> safetensors bytes: the only tensor serialisation the store uses (never pickle)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Mapping

if TYPE_CHECKING:
    import torch


def tensors_to_bytes(tensors: Mapping[str, "torch.Tensor"], metadata: Mapping[str, str] | None = None) -> bytes:
    """Serialise a name -> tensor dict; `metadata` is safetensors' str -> str header map."""
    import torch
    from safetensors.torch import save

    for name, value in tensors.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise ValueError(f"tensor dict entries must be str -> torch.Tensor, got {name!r}: {type(value).__name__}")
    if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ValueError("safetensors metadata must map str -> str")
    # detach + contiguous: safetensors refuses views with gaps and autograd tensors.
    plain = {name: value.detach().contiguous() for name, value in tensors.items()}
    try:
        return save(plain, metadata=dict(metadata) if metadata else None)
    except RuntimeError as err:
        # Raised for tensors that share storage (tied weights): safetensors stores each once.
        reason = " ".join(str(err).split())
        raise ValueError(f"cannot serialise tensor dict: {reason} Clone tied tensors before storing them.") from err


def tensors_from_bytes(data: bytes) -> dict[str, "torch.Tensor"]:
    """Deserialise bytes written by `tensors_to_bytes` into CPU tensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    try:
        return load(data)
    except SafetensorError as err:
        raise ValueError(f"bytes are not a safetensors tensor dict ({len(data)} bytes): {err}") from err


def tensors_from_file(path: str | os.PathLike[str]) -> dict[str, "torch.Tensor"]:
    """Load a safetensors file into CPU tensors that own their memory (pread, not mmap: the file
    may be a temporary download that is deleted next)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(path, backend="pread")
    except SafetensorError as err:
        raise ValueError(f"{path} is not a safetensors tensor dict: {err}") from err
