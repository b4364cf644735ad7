"""Sender side of PULSESync: turn two BF16 weight versions into a lossless sparse patch.

Example:
    patch = encode_patch(prev_bf16, model.state_dict(), base_version=6, version=7)
    store.put_patch(7, patch)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch
import zstandard

from workers.pulse.patch_format import BF16, FORMAT_VERSION, MODES, STREAM_LAYOUTS, pack_patch
from workers.pulse.streams import (
    GAP_ESCAPES_BY_WIDTH,
    GAP_STREAMS_BY_WIDTH,
    MAGNITUDE_ESCAPES,
    changed_indices,
    choose_gap_width,
    gaps_from_indices,
    split_bf16,
    split_levels,
    stream_to_bytes,
    ulp_delta_split,
)
from workers.pulse.weights_hash import as_bf16, bf16_bits, weights_hash


def encode_patch(
    prev: Mapping[str, torch.Tensor],
    cur: Mapping[str, torch.Tensor],
    *,
    base_version: int,
    version: int,
    mode: str = "absolute",
    level: int = 1,
) -> bytes:
    """Patch that turns BF16 weights `prev` (version base_version) into `cur` (version).

    prev/cur map names to BF16 tensors, or FP32 tensors that are cast with
    .to(torch.bfloat16) as the forward pass does. Only values whose BF16 bit pattern
    changed are stored: absolute new values in mode "absolute" (re-applying is
    harmless), the signed bit-pattern difference in mode "ulp_delta" (smaller; the
    receiver must hold exactly `prev`). `level` is the zstd level.
    """
    _check_args(prev, cur, base_version, version, mode)
    prev_bf16 = {name: as_bf16(prev[name], name) for name in prev}
    cur_bf16 = {name: as_bf16(cur[name], name) for name in cur}
    streams = _Streams({name: [] for name, _, _ in STREAM_LAYOUTS[mode]})
    tensors = []
    for name in sorted(cur_bf16):
        entry = _add_tensor(streams, name, prev_bf16[name], cur_bf16[name], mode)
        if entry is not None:
            tensors.append(entry)
    stream_entries, payload = _compress_streams(streams.parts, mode, level)
    header = {
        "format_version": FORMAT_VERSION,
        "mode": mode,
        "zstd_level": level,
        "base_version": base_version,
        "version": version,
        "base_hash": weights_hash(prev_bf16),
        "target_hash": weights_hash(cur_bf16),
        "streams": stream_entries,
        "tensors": tensors,
    }
    return pack_patch(header, payload)


def _check_args(prev: Mapping, cur: Mapping, base_version: int, version: int, mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if not 0 <= base_version < version:
        raise ValueError(f"need 0 <= base_version < version, got base_version={base_version}, version={version}")
    if set(prev) != set(cur):
        raise ValueError(f"prev and cur hold different tensors: {sorted(set(prev) ^ set(cur))[:5]}")
    for name in cur:
        if tuple(prev[name].shape) != tuple(cur[name].shape):
            raise ValueError(f"tensor {name!r} changed shape: {tuple(prev[name].shape)} -> {tuple(cur[name].shape)}")


@dataclass
class _Streams:
    """Each stream's parts (one array per tensor) and its running element count."""

    parts: dict[str, list[np.ndarray]]
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, name: str, values: np.ndarray) -> None:
        self.parts[name].append(values)
        self.counts[name] = self.counts.get(name, 0) + values.size


def _add_tensor(streams: _Streams, name: str, prev: torch.Tensor, cur: torch.Tensor, mode: str) -> dict | None:
    """Append one tensor's changes to the streams; None when nothing changed."""
    prev_bits, cur_bits = bf16_bits(prev), bf16_bits(cur)
    indices = changed_indices(prev_bits, cur_bits)
    if indices.size == 0:
        return None
    offsets = {stream: streams.counts.get(stream, 0) for stream in streams.parts}
    gaps = gaps_from_indices(indices)
    gap_width = choose_gap_width(gaps)
    for stream, part in zip(
        GAP_STREAMS_BY_WIDTH[gap_width], split_levels(gaps, GAP_ESCAPES_BY_WIDTH[gap_width]), strict=False
    ):
        streams.add(stream, part)
    new_bits = cur_bits[indices]
    if mode == "absolute":
        exponent, sign_mantissa = split_bf16(new_bits)
        streams.add("value_exponent", exponent)
        streams.add("value_sign_mantissa", sign_mantissa)
    else:
        negative, magnitude = ulp_delta_split(prev_bits[indices], new_bits)
        narrow, wide = split_levels(magnitude, MAGNITUDE_ESCAPES)
        streams.add("delta_sign", negative)
        streams.add("delta_magnitude8", narrow)
        streams.add("delta_magnitude16", wide)
    return {
        "name": name,
        "shape": list(cur.shape),
        "dtype": BF16,
        "count": int(indices.size),
        "gap_width": gap_width,
        "offsets": offsets,
    }


def _compress_streams(streams: dict[str, list[np.ndarray]], mode: str, level: int) -> tuple[list[dict], bytes]:
    """One zstd frame per stream (each holds one kind of symbol, so each codes tightly)."""
    compressor = zstandard.ZstdCompressor(level=level, write_checksum=False)
    entries, frames, offset = [], [], 0
    for name, dtype, layout in STREAM_LAYOUTS[mode]:
        parts = streams[name]
        values = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        raw = stream_to_bytes(values, dtype, layout)
        frame = compressor.compress(raw) if raw else b""
        entries.append(
            {
                "name": name,
                "dtype": dtype,
                "layout": layout,
                "count": int(values.size),
                "offset": offset,
                "length": len(frame),
            }
        )
        frames.append(frame)
        offset += len(frame)
    return entries, b"".join(frames)
