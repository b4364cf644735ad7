"""The PULSESync patch container: fixed prefix, JSON header, zstd stream payload.

Layout (all integers little-endian)::

    magic "PULSEPAT" | u16 format version | u32 header length | u64 xxh3-64 of header
    | header (zstd frame of UTF-8 JSON) | payload (the zstd frames of every stream, back to back)

The header describes itself fully (versions, hashes, mode, streams with their byte
ranges, tensors with their element offsets into each stream) and carries an xxh3-128
checksum of the payload, so a reader can refuse a damaged patch before touching any
weights. Nothing here unpickles.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import xxhash
import zstandard

MAGIC = b"PULSEPAT"
FORMAT_VERSION = 1
SUPPORTED_FORMAT_VERSIONS = (1,)
PREFIX = struct.Struct("<8sHIQ")
MODES = ("absolute", "ulp_delta")
MAX_HEADER_BYTES = 64 << 20
"""Refuse headers that would decompress beyond this (about 300k tensors)."""
BF16 = "bfloat16"

# Streams per mode, with their element dtype and byte layout. "shuffle" stores the
# k-th byte of every element together (zstd then sees runs of near-constant high bytes);
# "bits" stores booleans packed eight to a byte.
STREAM_LAYOUTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "absolute": (
        ("gap8", "uint8", "plain"),
        ("gap16", "uint16", "shuffle"),
        ("gap64", "uint64", "shuffle"),
        ("value_exponent", "uint8", "plain"),
        ("value_sign_mantissa", "uint8", "plain"),
    ),
    "ulp_delta": (
        ("gap8", "uint8", "plain"),
        ("gap16", "uint16", "shuffle"),
        ("gap64", "uint64", "shuffle"),
        ("delta_sign", "bool", "bits"),
        ("delta_magnitude8", "uint8", "plain"),
        ("delta_magnitude16", "uint16", "shuffle"),
    ),
}


class PatchError(Exception):
    """A patch was refused (damaged, unsupported, or not meant for these weights).

    Raised before any weight is written, so the receiver's weights are unchanged.
    """


@dataclass(frozen=True)
class StreamEntry:
    """One compressed stream in the payload."""

    name: str
    """Stream name, one of the mode's STREAM_LAYOUTS names."""
    dtype: str
    """numpy dtype name of one element."""
    layout: str
    """plain, shuffle or bits."""
    count: int
    """Number of elements (bits for the bits layout)."""
    offset: int
    """Byte offset of the zstd frame inside the payload."""
    length: int
    """Byte length of the zstd frame (0 for an empty stream)."""


@dataclass(frozen=True)
class TensorEntry:
    """One changed tensor: where its elements sit in each stream."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    count: int
    """Number of changed BF16 values."""
    gap_width: int
    """Bytes of the first gap level: 1 (gap8, escapes to gap16) or 2 (gap16)."""
    offsets: dict[str, int] = field(default_factory=dict)
    """Element offset of this tensor's segment in each stream."""

    @property
    def numel(self) -> int:
        size = 1
        for dim in self.shape:
            size *= dim
        return size


@dataclass(frozen=True)
class PatchHeader:
    """Everything a patch says about itself; read it with read_patch_header."""

    format_version: int
    mode: str
    zstd_level: int
    base_version: int
    version: int
    base_hash: str
    target_hash: str
    payload_size: int
    payload_xxh3_128: str
    streams: tuple[StreamEntry, ...]
    tensors: tuple[TensorEntry, ...]
    header_size: int
    """Bytes of prefix plus JSON header, i.e. where the payload starts."""

    @property
    def num_changed(self) -> int:
        return sum(t.count for t in self.tensors)


def pack_patch(header: dict, payload: bytes) -> bytes:
    """Join prefix, JSON header and payload; `header` gets the payload checksum added."""
    header = dict(header, payload_size=len(payload), payload_xxh3_128=xxhash.xxh3_128_hexdigest(payload))
    # zstd: per-tensor entries repeat the same keys; compressed, a 160-tensor header
    # shrinks from ~33 KB to a few KB, which matters for sparse patches of small models.
    header_json = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    header_bytes = zstandard.ZstdCompressor(level=3, write_checksum=False).compress(header_json)
    prefix = PREFIX.pack(MAGIC, FORMAT_VERSION, len(header_bytes), xxhash.xxh3_64_intdigest(header_bytes))
    return prefix + header_bytes + payload


def read_patch_header(patch: bytes) -> PatchHeader:
    """Parse and check a patch's header and payload checksum without applying it.

    Raises PatchError for a truncated or corrupted patch or an unsupported format.
    """
    view = memoryview(patch)
    if len(view) < PREFIX.size:
        raise PatchError(f"patch truncated: {len(view)} bytes, shorter than the {PREFIX.size}-byte prefix")
    magic, format_version, header_len, header_digest = PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise PatchError(f"not a PULSE patch: magic {magic!r}, expected {MAGIC!r}")
    if format_version not in SUPPORTED_FORMAT_VERSIONS:
        raise PatchError(
            f"unsupported patch format version {format_version}; this reader supports {SUPPORTED_FORMAT_VERSIONS}"
        )
    header_end = PREFIX.size + header_len
    if len(view) < header_end:
        raise PatchError(f"patch truncated inside the header ({len(view)} of at least {header_end} bytes)")
    header_bytes = view[PREFIX.size : header_end]
    if xxhash.xxh3_64_intdigest(header_bytes) != header_digest:
        raise PatchError("patch header corrupted: checksum mismatch")
    try:
        if not 0 <= zstandard.frame_content_size(header_bytes) <= MAX_HEADER_BYTES:
            raise PatchError(f"patch header does not declare a size up to {MAX_HEADER_BYTES} bytes")
        header_json = zstandard.ZstdDecompressor().decompress(header_bytes, max_output_size=MAX_HEADER_BYTES)
        raw = json.loads(header_json)
    except zstandard.ZstdError as err:
        raise PatchError(f"patch header is not a readable zstd frame: {err}") from err
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise PatchError(f"patch header is not valid JSON: {err!r:.200}") from err
    header = _header_from_json(raw, header_end)
    if header.format_version != format_version:
        raise PatchError(
            f"format version {header.format_version} in the header disagrees with {format_version} in the prefix"
        )
    payload = view[header_end:]
    if len(payload) != header.payload_size:
        raise PatchError(f"patch payload is {len(payload)} bytes, header says {header.payload_size} (truncated?)")
    if xxhash.xxh3_128_hexdigest(payload) != header.payload_xxh3_128:
        raise PatchError("patch payload corrupted: checksum mismatch")
    return header


def _header_from_json(raw: object, header_size: int) -> PatchHeader:
    """Build a PatchHeader from parsed JSON, refusing anything malformed."""
    try:
        header = PatchHeader(
            format_version=_int(raw["format_version"]),
            mode=str(raw["mode"]),
            zstd_level=_int(raw["zstd_level"]),
            base_version=_int(raw["base_version"]),
            version=_int(raw["version"]),
            base_hash=str(raw["base_hash"]),
            target_hash=str(raw["target_hash"]),
            payload_size=_int(raw["payload_size"]),
            payload_xxh3_128=str(raw["payload_xxh3_128"]),
            streams=tuple(_stream_from_json(s) for s in raw["streams"]),
            tensors=tuple(_tensor_from_json(t) for t in raw["tensors"]),
            header_size=header_size,
        )
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise PatchError(f"patch header malformed: {err!r}") from err
    _check_layout(header)
    return header


def _stream_from_json(raw: dict) -> StreamEntry:
    return StreamEntry(
        name=str(raw["name"]),
        dtype=str(raw["dtype"]),
        layout=str(raw["layout"]),
        count=_int(raw["count"]),
        offset=_int(raw["offset"]),
        length=_int(raw["length"]),
    )


def _tensor_from_json(raw: dict) -> TensorEntry:
    return TensorEntry(
        name=str(raw["name"]),
        shape=tuple(_int(d) for d in raw["shape"]),
        dtype=str(raw["dtype"]),
        count=_int(raw["count"]),
        gap_width=_int(raw["gap_width"]),
        offsets={str(k): _int(v) for k, v in raw["offsets"].items()},
    )


def _int(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _check_layout(header: PatchHeader) -> None:
    """Streams must match the mode's layout and tile the payload; tensors must index them."""
    if header.mode not in MODES:
        raise PatchError(f"unknown patch mode {header.mode!r}; known: {MODES}")
    expected = [(name, dtype, layout) for name, dtype, layout in STREAM_LAYOUTS[header.mode]]
    if [(s.name, s.dtype, s.layout) for s in header.streams] != expected:
        raise PatchError(f"patch streams do not match the {header.mode} layout")
    position = 0
    for stream in header.streams:
        if stream.offset != position or stream.length < 0 or stream.count < 0:
            raise PatchError(f"stream {stream.name} has a bad byte range")
        position += stream.length
    if position != header.payload_size:
        raise PatchError("streams do not tile the payload")
    names = [t.name for t in header.tensors]
    if len(set(names)) != len(names):
        raise PatchError("a tensor appears twice in the patch header")
    counts = {s.name: s.count for s in header.streams}
    for entry in header.tensors:
        if entry.dtype != BF16 or entry.gap_width not in (1, 2) or entry.count <= 0:
            raise PatchError(f"tensor {entry.name}: bad dtype, gap width or count in header")
        if entry.count > entry.numel or any(d < 0 for d in entry.shape):
            raise PatchError(f"tensor {entry.name}: {entry.count} changes do not fit shape {entry.shape}")
        if set(entry.offsets) != set(counts) or any(not 0 <= entry.offsets[n] <= counts[n] for n in counts):
            raise PatchError(f"tensor {entry.name}: stream offsets out of range")
