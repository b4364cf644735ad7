"""Wire format of PULSELoCo and DiLoCo payloads: one replica's pseudo-gradient for one round.

Layout (little-endian)::

    prefix: magic "PULSELOC" | u8 format | u8 kind | u64 layout hash | u64 numel | u64 count
            | u32 round | u32 replica | u8 gap width | 4 x u32 frame lengths
            | u64 xxh3-64 of everything else (the prefix's other fields, then the body)
    body:   sparse: zstd frames gap8, gap16, gap64 (PULSESync's delta-coded index levels over
            the flat parameter vector) and the byte-shuffled FP32 values
            dense:  the raw FP32 vector (what DiLoCo sends)

The layout hash (names and shapes of the model) makes a replica refuse a payload from a
different model; round and replica make a stray or replayed payload detectable. The
checksum covers every other byte, so a damaged count, round or replica is refused like a
damaged body. Nothing here unpickles.

Example:
    payload = encode_sparse(update, layout_hash, round_index=3, replica=1)
    header, update = decode_sparse(payload, layout_hash)
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch
import xxhash
import zstandard

from workers.pulse.loco.maths import SparseUpdate
from workers.pulse.patch_format import PatchError
from workers.pulse.streams import (
    GAP_ESCAPES_BY_WIDTH,
    GAP_STREAMS_BY_WIDTH,
    choose_gap_width,
    decompress_exact,
    gaps_from_indices,
    indices_from_gaps,
    join_levels,
    split_levels,
    stream_from_bytes,
    stream_to_bytes,
)

MAGIC = b"PULSELOC"
FORMAT = 2
"""Format 2: the checksum covers the prefix too (format 1 covered the body only)."""
KINDS = {"sparse": 0, "dense": 1}
PREFIX = struct.Struct("<8sBBQQQIIB4IQ")
_STREAMS = (("gap8", "uint8", "plain"), ("gap16", "uint16", "shuffle"), ("gap64", "uint64", "shuffle"))
_VALUES = ("float32", "shuffle")


class PayloadError(Exception):
    """A payload was refused: damaged, truncated, from another model, round or replica."""


@dataclass(frozen=True)
class PayloadHeader:
    """What a payload says about itself."""

    kind: str
    """sparse (PULSELoCo) or dense (DiLoCo, DDP gradients)."""
    layout_hash: int
    """xxh3-64 of the model's tensor names and shapes (see layout_hash)."""
    numel: int
    """Length of the flat parameter vector."""
    count: int
    """Values carried (numel for dense)."""
    round_index: int
    """Round (or, for DDP, step) the payload belongs to."""
    replica: int
    """Sending replica."""


def layout_hash(names_and_shapes: Iterable[tuple[str, tuple[int, ...]]]) -> int:
    """xxh3-64 identity of a model's flat layout (names and shapes in flatten order)."""
    text = "\n".join(f"{name}:{','.join(map(str, shape))}" for name, shape in names_and_shapes)
    return xxhash.xxh3_64_intdigest(text.encode())


def encode_sparse(update: SparseUpdate, layout: int, *, round_index: int, replica: int, level: int = 1) -> bytes:
    """Delta-coded indices and FP32 values, each stream its own zstd frame."""
    indices = update.indices.numpy()
    gaps = gaps_from_indices(indices)
    width = choose_gap_width(gaps) if gaps.size else 1
    levels = dict(zip(GAP_STREAMS_BY_WIDTH[width], split_levels(gaps, GAP_ESCAPES_BY_WIDTH[width]), strict=False))
    compressor = zstandard.ZstdCompressor(level=level, write_checksum=False)
    frames = []
    for name, dtype, layout_kind in _STREAMS:
        raw = stream_to_bytes(levels[name], dtype, layout_kind) if name in levels else b""
        frames.append(compressor.compress(raw) if raw else b"")
    values = update.values.numpy()
    frames.append(compressor.compress(stream_to_bytes(values, *_VALUES)) if values.size else b"")
    return _pack("sparse", layout, update.numel, int(indices.size), round_index, replica, width, frames)


def encode_dense(vector_N: torch.Tensor, layout: int, *, round_index: int, replica: int) -> bytes:
    """The raw FP32 vector (DiLoCo pseudo-gradient or a DDP gradient)."""
    raw = vector_N.detach().to(torch.float32).contiguous().numpy().astype("<f4", copy=False).tobytes()
    return _pack("dense", layout, vector_N.numel(), vector_N.numel(), round_index, replica, 1, [raw, b"", b"", b""])


def read_header(payload: bytes, layout: int, numel: int | None = None) -> PayloadHeader:
    """Parse and check the prefix and the checksum; refuse a payload for another model
    (another layout hash, or, when given, another parameter count `numel`)."""
    if len(payload) < PREFIX.size:
        raise PayloadError(f"payload truncated: {len(payload)} bytes, shorter than the {PREFIX.size}-byte prefix")
    expected_numel = numel
    magic, fmt, kind, got_layout, numel, count, round_index, replica, width, *rest = PREFIX.unpack_from(payload)
    lengths, digest = rest[:4], rest[4]
    if magic != MAGIC or fmt != FORMAT or kind not in KINDS.values() or width not in GAP_STREAMS_BY_WIDTH:
        raise PayloadError(f"not a PULSELoCo payload of format {FORMAT} (magic {magic!r}, format {fmt}, kind {kind})")
    if got_layout != layout:
        raise PayloadError(f"payload is for another model layout ({got_layout:#x}, expected {layout:#x})")
    body = memoryview(payload)[PREFIX.size :]
    if len(body) != sum(lengths) or checksum(payload[: PREFIX.size - 8], body) != digest:
        raise PayloadError("payload truncated or corrupted: size or checksum mismatch")
    if count > numel:
        raise PayloadError(f"payload claims {count} values for {numel} parameters")
    if expected_numel is not None and numel != expected_numel:
        raise PayloadError(f"payload is for {numel} parameters, this model has {expected_numel}")
    name = next(k for k, v in KINDS.items() if v == kind)
    return PayloadHeader(name, got_layout, numel, count, round_index, replica)


def decode_sparse(payload: bytes, layout: int, numel: int | None = None) -> tuple[PayloadHeader, SparseUpdate]:
    """Invert encode_sparse, checking every stream's size, the index range and that every value is finite."""
    header = read_header(payload, layout, numel)
    if header.kind != "sparse":
        raise PayloadError(f"expected a sparse payload, got {header.kind}")
    frames = _frames(payload)
    width = PREFIX.unpack_from(payload)[8]
    names = GAP_STREAMS_BY_WIDTH[width]
    escapes = GAP_ESCAPES_BY_WIDTH[width]
    spec = {name: (dtype, layout_kind) for name, dtype, layout_kind in _STREAMS}
    levels, expected = [], header.count
    for index, name in enumerate(names):
        stored = _stream(frames[[s[0] for s in _STREAMS].index(name)], *spec[name], expected)
        levels.append(stored)
        if index < len(escapes):
            expected = int(np.count_nonzero(stored == escapes[index]))
    try:
        indices = indices_from_gaps(join_levels(levels, escapes), header.numel)
    except PatchError as err:
        raise PayloadError(f"payload indices refused: {err}") from err
    values = _stream(frames[3], *_VALUES, header.count)
    if not np.isfinite(values).all():
        raise PayloadError("payload carries non-finite values (NaN or infinity)")
    update = SparseUpdate(
        torch.from_numpy(indices.astype(np.int64)), torch.from_numpy(values.astype(np.float32)), header.numel
    )
    return header, update


def decode_dense(payload: bytes, layout: int, numel: int | None = None) -> tuple[PayloadHeader, torch.Tensor]:
    """Invert encode_dense, refusing non-finite values."""
    header = read_header(payload, layout, numel)
    if header.kind != "dense":
        raise PayloadError(f"expected a dense payload, got {header.kind}")
    raw, *rest = _frames(payload)
    if len(raw) != 4 * header.numel or any(rest) or header.count != header.numel:
        raise PayloadError(
            f"dense payload holds {len(raw)} bytes (+{sum(map(len, rest))} stray) for {header.numel} FP32 values"
        )
    vector = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    if not np.isfinite(vector).all():
        raise PayloadError("payload carries non-finite values (NaN or infinity)")
    return header, torch.from_numpy(vector)


def checksum(head: bytes, body: bytes) -> int:
    """xxh3-64 of the prefix without its checksum field (`head`), then the body."""
    digest = xxhash.xxh3_64()
    digest.update(head)
    digest.update(body)
    return digest.intdigest()


def _pack(
    kind: str, layout: int, numel: int, count: int, round_index: int, replica: int, width: int, frames: list[bytes]
) -> bytes:
    body = b"".join(frames)
    fields = (MAGIC, FORMAT, KINDS[kind], layout, numel, count, round_index, replica, width, *(len(f) for f in frames))
    head = PREFIX.pack(*fields, 0)[:-8]
    return head + struct.pack("<Q", checksum(head, body)) + body


def _frames(payload: bytes) -> list[bytes]:
    lengths = PREFIX.unpack_from(payload)[9:13]
    frames, offset = [], PREFIX.size
    for length in lengths:
        frames.append(bytes(payload[offset : offset + length]))
        offset += length
    return frames


def _stream(frame: bytes, dtype: str, layout_kind: str, count: int) -> np.ndarray:
    """Decompress one frame (bounded by its declared element count) and parse it."""
    size = count * np.dtype(dtype).itemsize
    if not frame:
        if count:
            raise PayloadError(f"empty {dtype} stream where {count} values were expected")
        return np.zeros(0, dtype=dtype)
    try:
        raw = decompress_exact(frame, size, f"payload {dtype} stream")
        return stream_from_bytes(raw, dtype, layout_kind, count)
    except PatchError as err:
        raise PayloadError(f"payload stream refused: {err}") from err
