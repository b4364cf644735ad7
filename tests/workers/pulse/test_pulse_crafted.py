"""Crafted PULSE patches (every checksum right) that once got past the checks: refused with PatchError,
weights untouched."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
import zstandard

from workers.pulse import PatchError, apply_patch, encode_patch, read_patch_header, weights_hash
from workers.pulse.patch_format import PREFIX, pack_patch
from workers.pulse.streams import stream_to_bytes


def _four_changes() -> tuple[dict, bytes]:
    prev = {"a": (torch.arange(300, dtype=torch.float32) / 300).to(torch.bfloat16)}
    cur = {"a": prev["a"].clone()}
    cur["a"].view(torch.int16)[[3, 50, 100, 299]] += 1
    return prev, encode_patch(prev, cur, base_version=0, version=1)


def _rewrite(patch: bytes, streams: dict[str, tuple[bytes, int]]) -> bytes:
    """Replace some streams' (zstd frame, element count), re-tile the payload and re-sign the patch."""
    header = read_patch_header(patch)
    raw = json.loads(zstandard.ZstdDecompressor().decompress(patch[PREFIX.size : header.header_size]))
    payload = patch[header.header_size :]
    frames = []
    for entry in raw["streams"]:
        frame, count = streams.get(
            entry["name"], (payload[entry["offset"] : entry["offset"] + entry["length"]], entry["count"])
        )
        entry["count"] = count
        frames.append(frame)
    offset = 0
    for entry, frame in zip(raw["streams"], frames, strict=False):
        entry["offset"], entry["length"] = offset, len(frame)
        offset += len(frame)
    return pack_patch(raw, b"".join(frames))


def _refused_untouched(receiver: dict, patch: bytes, match: str) -> None:
    before = weights_hash(receiver)
    with pytest.raises(PatchError, match=match):
        apply_patch(receiver, patch, base_version=0)
    assert weights_hash(receiver) == before


def test_gaps_whose_sum_wraps_past_2_to_the_64_are_refused() -> None:
    # Four gaps of 2**62 - 1: their running sum wraps int64 to -1, which once passed the range check.
    prev, patch = _four_changes()
    gap = (1 << 62) - 1
    compress = zstandard.ZstdCompressor().compress
    crafted = _rewrite(
        patch,
        {
            "gap8": (compress(stream_to_bytes(np.full(4, 255), "uint8", "plain")), 4),
            "gap16": (compress(stream_to_bytes(np.full(4, 65535), "uint16", "shuffle")), 4),
            "gap64": (
                compress(stream_to_bytes(np.full(4, gap - 255 - 65535, dtype=np.uint64), "uint64", "shuffle")),
                4,
            ),
        },
    )
    _refused_untouched(prev, crafted, "out of range")


def _frame_declaring(size: int) -> bytes:
    """A 17-byte zstd frame whose header says it decompresses to `size` bytes (it holds one)."""
    magic, descriptor, window = struct.pack("<I", 0xFD2FB528), bytes([0xC0]), bytes([0x00])
    raw_block = bytes([(1 << 3) | 1, 0, 0]) + b"\x07"  # last block, raw, 1 byte
    return magic + descriptor + window + struct.pack("<Q", size) + raw_block


def test_a_stream_declaring_a_terabyte_is_refused_before_anything_is_allocated() -> None:
    prev, patch = _four_changes()
    crafted = _rewrite(patch, {"gap8": (_frame_declaring(1 << 40), 1 << 40)})
    assert zstandard.frame_content_size(_frame_declaring(1 << 40)) == 1 << 40
    _refused_untouched(prev, crafted, "cannot hold")
