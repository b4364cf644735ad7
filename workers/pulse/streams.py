"""Vectorised numpy codecs behind PULSE patches: gaps, escape levels, BF16 splits, byte layouts.

Every function works on whole arrays (no Python loop over elements), and every decoder
checks what it reads, raising PatchError, because its input comes over the network.
"""

from __future__ import annotations

import numpy as np
import zstandard

from workers.pulse.patch_format import PatchError

GAP_STREAMS_BY_WIDTH = {1: ("gap8", "gap16", "gap64"), 2: ("gap16", "gap64")}
"""Gap streams by first-level width, narrowest first."""
GAP_ESCAPES_BY_WIDTH = {1: (255, 65535), 2: (65535,)}
"""Escape values of the gap levels: width 1 is gap8 -> gap16 -> gap64, width 2 is gap16 -> gap64."""
MAGNITUDE_ESCAPES = (255,)
"""ULP magnitudes: delta_magnitude8 -> delta_magnitude16 (|delta| - 1 <= 32767 always fits)."""
MAX_ZSTD_RATIO = 1 << 16
"""No zstd frame expands more than this (a 128 KiB block from a 3-byte header and 1 RLE byte is 32768x):
a stream that declares more output than its frame could hold is refused before anything is allocated."""
WIDE_GAP_SHARE = 0.6
"""Use 2-byte first-level gaps when at least this share of gaps would escape a byte.

Measured on 8M uniform positions (gap-stream bytes per changed value, 1-byte vs 2-byte
first level): 46 % escapes 1.33 vs 1.37, 60 % 1.49 vs 1.49, 76 % 1.68 vs 1.64.
"""


def changed_indices(prev_bits: np.ndarray, cur_bits: np.ndarray) -> np.ndarray:
    """Sorted flat int64 positions where two int16 bit-pattern arrays differ."""
    return np.flatnonzero(prev_bits != cur_bits)


def gaps_from_indices(indices: np.ndarray) -> np.ndarray:
    """Delta-code sorted distinct indices: gap = index - previous index - 1 (first: index)."""
    gaps = np.empty_like(indices)
    if indices.size:
        gaps[0] = indices[0]
        np.subtract(indices[1:], indices[:-1], out=gaps[1:])
        gaps[1:] -= 1
    return gaps


def indices_from_gaps(gaps: np.ndarray, numel: int) -> np.ndarray:
    """Invert gaps_from_indices, refusing indices outside a tensor of numel elements."""
    if gaps.size and int(gaps.min()) < 0:
        raise PatchError("negative index gap in patch")
    # Every gap is below numel in a valid patch; past 2**63 the int64 running sum would wrap
    # around to indices that look in range (then written to the wrong places).
    if gaps.size and (int(gaps.max()) >= numel or gaps.size * (int(gaps.max()) + 1) >= 1 << 63):
        raise PatchError(f"patch index gap out of range for {numel} elements")
    indices = np.cumsum(gaps + 1)
    indices -= 1
    if indices.size and int(indices[-1]) >= numel:
        raise PatchError(f"patch index {int(indices[-1])} out of range for {numel} elements")
    return indices


def choose_gap_width(gaps: np.ndarray) -> int:
    """1 or 2 bytes for the first gap level, whichever suits this tensor's density."""
    escaping = np.count_nonzero(gaps >= GAP_ESCAPES_BY_WIDTH[1][0])
    return 2 if escaping >= WIDE_GAP_SHARE * gaps.size else 1


def split_levels(values: np.ndarray, escapes: tuple[int, ...]) -> list[np.ndarray]:
    """Width-reduce non-negative integers into len(escapes) + 1 levels.

    Level i stores min(value, escape_i); a value that hits the escape carries its
    remainder (value - escape_i) to level i + 1. The last level stores what is left.
    """
    levels = []
    remainder = values
    for escape in escapes:
        stored = np.minimum(remainder, escape)
        levels.append(stored)
        remainder = remainder[stored == escape] - escape
    levels.append(remainder)
    return levels


def join_levels(levels: list[np.ndarray], escapes: tuple[int, ...], dtype: type = np.int64) -> np.ndarray:
    """Invert split_levels into `dtype`; each level must hold exactly one entry per escape above it."""
    last = levels[-1]
    if last.dtype == np.uint64 and last.size and int(last.max()) >= 1 << 62:
        raise PatchError("patch gap out of range")
    values = last.astype(dtype)
    for stored, escape in zip(reversed(levels[:-1]), reversed(escapes), strict=False):
        escaped = stored == escape
        if np.count_nonzero(escaped) != values.size:
            raise PatchError("patch escape counts do not match the next level")
        wider = stored.astype(dtype)
        wider[escaped] += values
        values = wider
    return values


def split_bf16(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """BF16 bit patterns -> (exponent byte, sign + 7 mantissa bits byte).

    Why not the plain high/low bytes: the exponent alone is low-entropy (weights share
    a few octaves), while sign and mantissa are near-uniform; keeping them apart lets
    zstd's entropy stage code the exponent tightly and leave the other byte raw.
    """
    word = bits.view(np.uint16)
    exponent = (word >> 7).astype(np.uint8)
    sign_mantissa = (((word >> 8) & 0x80) | (word & 0x7F)).astype(np.uint8)
    return exponent, sign_mantissa


def join_bf16(exponent: np.ndarray, sign_mantissa: np.ndarray) -> np.ndarray:
    """Invert split_bf16, returning int16 bit patterns."""
    sign_mantissa = sign_mantissa.astype(np.uint16)
    word = ((sign_mantissa & 0x80) << 8) | (exponent.astype(np.uint16) << 7) | (sign_mantissa & 0x7F)
    return word.view(np.int16)


def ulp_delta_split(prev_bits: np.ndarray, cur_bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Bit-pattern difference (mod 2**16, never 0) -> (is negative, |delta| - 1)."""
    # int16 arithmetic wraps mod 2**16, so this is the signed difference of the patterns.
    delta = cur_bits - prev_bits
    negative = delta < 0
    # |delta| - 1 lies in [0, 32767]: int16 abs(-32768) wraps to -32768, which as uint16 is 32768.
    magnitude = np.abs(delta).view(np.uint16)
    magnitude -= 1
    return negative, magnitude


def ulp_delta_apply(prev_bits: np.ndarray, negative: np.ndarray, magnitude: np.ndarray) -> np.ndarray:
    """New int16 bit patterns = prev + delta (mod 2**16)."""
    # All int16 arithmetic here wraps mod 2**16, which is exactly the arithmetic we want;
    # multiplying by +-1 is ~8x faster than np.where or a masked negate.
    delta = magnitude.astype(np.int16)
    delta += 1
    sign = negative.view(np.int8).astype(np.int16)
    sign *= -2
    sign += 1
    delta *= sign
    delta += prev_bits
    return delta


def decompress_exact(frame: bytes | memoryview, size: int, what: str) -> bytes:
    """Decompress one zstd frame that must hold exactly `size` bytes, refusing (PatchError) before
    allocating when the frame declares another size or could not expand that far."""
    if size > MAX_ZSTD_RATIO * len(frame) + 1024:
        raise PatchError(f"{what}: {len(frame)} compressed bytes cannot hold the {size} bytes declared")
    try:
        if zstandard.frame_content_size(frame) != size:
            raise PatchError(f"{what}: zstd frame does not hold {size} bytes")
        raw = zstandard.ZstdDecompressor().decompress(frame, max_output_size=max(size, 1))
    except zstandard.ZstdError as err:
        raise PatchError(f"{what}: zstd frame unreadable: {err}") from err
    if len(raw) != size:
        raise PatchError(f"{what}: zstd frame holds {len(raw)} bytes, not {size}")
    return raw


def stream_to_bytes(values: np.ndarray, dtype: str, layout: str) -> bytes:
    """Cast to the stream's dtype and lay its bytes out (plain, shuffle or bits)."""
    if layout == "bits":
        return np.packbits(values.astype(bool), bitorder="little").tobytes()
    typed = values.astype(np.dtype(dtype).newbyteorder("<"), copy=False)
    if layout == "shuffle" and typed.itemsize > 1:
        return typed.view(np.uint8).reshape(-1, typed.itemsize).T.tobytes()
    return typed.tobytes()


def stream_from_bytes(buffer: bytes, dtype: str, layout: str, count: int) -> np.ndarray:
    """Invert stream_to_bytes, refusing a buffer of the wrong size."""
    if layout == "bits":
        if len(buffer) != (count + 7) // 8:
            raise PatchError("bit stream has the wrong size")
        packed = np.frombuffer(buffer, dtype=np.uint8)
        return np.unpackbits(packed, count=count, bitorder="little").view(bool)
    typed = np.dtype(dtype).newbyteorder("<")
    if len(buffer) != count * typed.itemsize:
        raise PatchError(f"stream of {count} {dtype} has {len(buffer)} bytes")
    raw = np.frombuffer(buffer, dtype=np.uint8)
    if layout == "shuffle" and typed.itemsize > 1:
        raw = raw.reshape(typed.itemsize, count).T.copy()
    return raw.view(typed).reshape(count)
