"""Fuzzing PULSELoCo / DiLoCo payloads: only PayloadError comes out, and what decodes is safe to average.

Crafted payloads carry a correct checksum (`_signed`), so they reach the stream decoders;
random bytes and damaged real payloads must be refused, whichever byte was damaged.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import given
from hypothesis import strategies as st

from tests.fuzz.fuzzing import FUZZ, count_input
from workers.pulse.loco.codec import (
    FORMAT,
    KINDS,
    MAGIC,
    PREFIX,
    PayloadError,
    checksum,
    decode_dense,
    decode_sparse,
    encode_sparse,
)
from workers.pulse.loco.maths import SparseUpdate

LAYOUT = 0x1234
NUMEL = 5000
edge_ints = st.sampled_from(
    [0, 1, 2, 255, 256, 65535, 65536, NUMEL - 1, NUMEL, NUMEL + 1, 2**32 - 1, 2**40, 2**63, 2**64 - 1]
)
frames = (
    st.just(b"")
    | st.binary(max_size=64)
    | st.builds(lambda b: zstandard.ZstdCompressor().compress(b), st.binary(max_size=300))
    | st.builds(
        lambda b, n: zstandard.ZstdCompressor().compress(b * n), st.binary(min_size=1, max_size=8), st.integers(1, 5000)
    )
)


def _signed(kind: int, numel: int, count: int, width: int, parts: list[bytes], fmt: int = FORMAT) -> bytes:
    body = b"".join(parts)
    head = PREFIX.pack(MAGIC, fmt, kind, LAYOUT, numel, count, 3, 1, width, *(len(p) for p in parts), 0)[:-8]
    return head + checksum(head, body).to_bytes(8, "little") + body


def _check_decoded(decode, payload: bytes, numel: int | None) -> None:
    count_input("loco_payload")
    try:
        header, update = decode(payload, LAYOUT, numel)
    except PayloadError:
        return
    if isinstance(update, SparseUpdate):
        indices = update.indices.numpy()
        assert indices.size == header.count and update.values.numel() == header.count
        assert indices.size == 0 or (indices[0] >= 0 and indices[-1] < header.numel and np.all(np.diff(indices) > 0))
        assert torch.isfinite(update.values).all()
    else:
        assert update.numel() == header.numel and torch.isfinite(update).all()


@FUZZ
@given(
    st.sampled_from([0, 1]),
    edge_ints | st.integers(0, 2 * NUMEL),
    edge_ints | st.integers(0, 600),
    st.sampled_from([1, 2, 0, 3]),
    st.lists(frames, min_size=4, max_size=4),
    st.sampled_from([None, NUMEL]),
)
def test_crafted_payloads_decode_safely_or_raise_payload_error(kind, numel, count, width, parts, expect) -> None:
    payload = _signed(kind, numel, count, width, parts)
    _check_decoded(decode_sparse if kind == KINDS["sparse"] else decode_dense, payload, expect)


@FUZZ
@given(st.binary(max_size=200), st.sampled_from([decode_sparse, decode_dense]))
def test_random_bytes_raise_payload_error(data: bytes, decode) -> None:
    count_input("loco_payload")
    with pytest.raises(PayloadError):
        decode(data, LAYOUT, None)


@FUZZ
@given(st.lists(st.integers(0, NUMEL - 1), unique=True, max_size=300), st.data())
def test_damaged_real_payloads_raise_payload_error(positions: list[int], data: st.DataObject) -> None:
    indices = torch.tensor(sorted(positions), dtype=torch.int64)
    update = SparseUpdate(indices, torch.randn(len(positions)), NUMEL)
    payload = bytearray(encode_sparse(update, LAYOUT, round_index=3, replica=1))
    at = data.draw(st.integers(0, len(payload) - 1))
    payload[at] ^= data.draw(st.integers(1, 255))
    count_input("loco_payload")
    with pytest.raises(PayloadError):  # any byte: prefix fields (count, round, replica) included
        decode_sparse(bytes(payload), LAYOUT, NUMEL)


def test_a_damaged_round_or_replica_field_is_refused() -> None:
    payload = encode_sparse(
        SparseUpdate(torch.tensor([1, 7]), torch.tensor([0.5, -1.0]), NUMEL), LAYOUT, round_index=3, replica=1
    )
    header, _ = decode_sparse(payload, LAYOUT, NUMEL)
    assert (header.round_index, header.replica) == (3, 1)
    round_at = PREFIX.size - 8 - 1 - 4 * 4 - 4 - 4  # u32 round, u32 replica, u8 width, 4 x u32 lengths, u64 checksum
    for at in (round_at, round_at + 4):
        damaged = bytearray(payload)
        damaged[at] ^= 1
        with pytest.raises(PayloadError, match="corrupted"):
            decode_sparse(bytes(damaged), LAYOUT, NUMEL)


def test_a_payload_declaring_a_huge_stream_is_refused_before_allocating() -> None:
    # A 40-byte frame that says it holds 2**40 bytes: decompressing it would try to allocate a terabyte.
    frame = zstandard.ZstdCompressor().compress(b"\0" * 64)
    payload = _signed(KINDS["sparse"], 2**41, 2**40, 1, [frame, b"", b"", b""])
    try:
        decode_sparse(payload, LAYOUT)
    except PayloadError as err:
        assert "cannot hold" in str(err)
    else:
        raise AssertionError("a payload declaring 2**40 values was accepted")


def test_a_payload_for_another_parameter_count_or_with_nan_is_refused() -> None:
    update = SparseUpdate(torch.tensor([1, 7]), torch.tensor([0.5, float("nan")]), NUMEL)
    payload = encode_sparse(update, LAYOUT, round_index=3, replica=1)
    for numel, message in ((NUMEL + 1, "this model has"), (NUMEL, "non-finite")):
        try:
            decode_sparse(payload, LAYOUT, numel)
        except PayloadError as err:
            assert message in str(err)
        else:
            raise AssertionError(f"accepted: {message}")
