"""Receiver side of PULSESync: check a patch completely, then write it into BF16 weights in place.

Example:
    apply_patch(model_weights, store.get_patch(7), base_version=6)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from workers.pulse.patch_format import PatchError, PatchHeader, TensorEntry, read_patch_header
from workers.pulse.streams import (
    GAP_ESCAPES_BY_WIDTH,
    GAP_STREAMS_BY_WIDTH,
    MAGNITUDE_ESCAPES,
    decompress_exact,
    indices_from_gaps,
    join_bf16,
    join_levels,
    stream_from_bytes,
    ulp_delta_apply,
)
from workers.pulse.weights_hash import bf16_bits, weights_hash


@dataclass(frozen=True)
class TensorUpdate:
    """Decoded changes of one tensor: flat positions and their new int16 bit patterns."""

    name: str
    indices: np.ndarray
    new_bits: np.ndarray


def apply_patch(weights: Mapping[str, torch.Tensor], patch: bytes, *, base_version: int | None = None) -> None:
    """Write a patch into the receiver's BF16 tensors in place.

    Everything is checked and decoded before the first write, so a refused patch
    (PatchError) leaves the weights untouched. `base_version`, when given, is the
    receiver's current version and must equal the patch's base. Mode "ulp_delta"
    also requires the receiver's weights hash to equal the patch's base hash; mode
    "absolute" does not (it writes absolute values, so applying twice is harmless).
    """
    header = read_patch_header(patch)
    if base_version is not None and base_version != header.base_version:
        raise PatchError(f"patch goes from version {header.base_version}, receiver is at version {base_version}")
    _check_receiver(weights, header)
    if header.mode == "ulp_delta" and weights_hash(weights) != header.base_hash:
        raise PatchError("ulp_delta patch refused: receiver's weights hash differs from the patch's base hash")
    updates = decode_updates(weights, patch, header)
    with torch.no_grad():
        for update in updates:
            _write(weights[update.name], update)


def _check_receiver(weights: Mapping[str, torch.Tensor], header: PatchHeader) -> None:
    for entry in header.tensors:
        if entry.name not in weights:
            raise PatchError(f"patch names tensor {entry.name!r}, which the receiver does not hold")
        tensor = weights[entry.name]
        if tuple(tensor.shape) != entry.shape:
            raise PatchError(f"tensor {entry.name!r}: receiver shape {tuple(tensor.shape)}, patch shape {entry.shape}")
        if tensor.dtype != torch.bfloat16:
            raise PatchError(f"tensor {entry.name!r}: receiver dtype {tensor.dtype}, patch carries bfloat16")
        if not tensor.is_contiguous():
            raise PatchError(f"tensor {entry.name!r} is not contiguous; cannot patch it in place")


def decode_updates(weights: Mapping[str, torch.Tensor], patch: bytes, header: PatchHeader) -> list[TensorUpdate]:
    """Decompress every stream and rebuild each tensor's (indices, new bit patterns)."""
    streams = _decompress_streams(patch, header)
    updates = []
    for position, entry in enumerate(header.tensors):
        segment = _segments(header, position, streams)
        gap_names = GAP_STREAMS_BY_WIDTH[entry.gap_width]
        gaps = join_levels([segment[name] for name in gap_names], GAP_ESCAPES_BY_WIDTH[entry.gap_width])
        if entry.gap_width == 2 and segment["gap8"].size:
            raise PatchError(f"tensor {entry.name!r}: stray gap8 entries for a 2-byte-gap tensor")
        if gaps.size != entry.count:
            raise PatchError(f"tensor {entry.name!r}: {gaps.size} positions decoded, header says {entry.count}")
        indices = indices_from_gaps(gaps, entry.numel)
        updates.append(TensorUpdate(entry.name, indices, _new_bits(weights, entry, indices, segment, header.mode)))
    return updates


def _new_bits(
    weights: Mapping[str, torch.Tensor],
    entry: TensorEntry,
    indices: np.ndarray,
    segment: dict[str, np.ndarray],
    mode: str,
) -> np.ndarray:
    """New int16 bit patterns at `indices`: absolute values, or the receiver's plus the ULP deltas."""
    if mode == "absolute":
        exponent, sign_mantissa = segment["value_exponent"], segment["value_sign_mantissa"]
        if exponent.size != entry.count or sign_mantissa.size != entry.count:
            raise PatchError(f"tensor {entry.name!r}: value streams do not hold {entry.count} values")
        return join_bf16(exponent, sign_mantissa)
    negative = segment["delta_sign"]
    # int32: a magnitude is at most 255 + 65535 even in a crafted patch.
    magnitude = join_levels([segment["delta_magnitude8"], segment["delta_magnitude16"]], MAGNITUDE_ESCAPES, np.int32)
    if negative.size != entry.count or magnitude.size != entry.count:
        raise PatchError(f"tensor {entry.name!r}: delta streams do not hold {entry.count} values")
    prev_bits = bf16_bits(weights[entry.name])[indices]
    return ulp_delta_apply(prev_bits, negative, magnitude)


def _decompress_streams(patch: bytes, header: PatchHeader) -> dict[str, np.ndarray]:
    view = memoryview(patch)[header.header_size :]
    streams = {}
    for stream in header.streams:
        frame = view[stream.offset : stream.offset + stream.length]
        expected = (
            (stream.count + 7) // 8 if stream.layout == "bits" else stream.count * np.dtype(stream.dtype).itemsize
        )
        raw = b"" if stream.length == 0 else decompress_exact(frame, expected, f"stream {stream.name}")
        streams[stream.name] = stream_from_bytes(raw, stream.dtype, stream.layout, stream.count)
    return streams


def _segments(header: PatchHeader, position: int, streams: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """This tensor's slice of every stream: from its offset to the next tensor's."""
    entry = header.tensors[position]
    following = header.tensors[position + 1] if position + 1 < len(header.tensors) else None
    segment = {}
    for name, values in streams.items():
        start = entry.offsets[name]
        end = following.offsets[name] if following is not None else values.size
        if end < start:
            raise PatchError(f"tensor {entry.name!r}: stream {name} offsets go backwards")
        segment[name] = values[start:end]
    return segment


def _write(tensor: torch.Tensor, update: TensorUpdate) -> None:
    """index_copy_ into the int16 view of the tensor's storage (on its own device)."""
    flat = tensor.detach().view(torch.int16).view(-1)
    indices = torch.from_numpy(update.indices).to(flat.device)
    values = torch.from_numpy(update.new_bits).to(flat.device)
    flat.index_copy_(0, indices, values)
