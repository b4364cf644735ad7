"""Fuzzing PULSE patches and anchors: only PatchError / ValueError come out, and refused bytes leave the weights alone.

Three depths of input: raw bytes and damaged patches (stopped by the checksums), patches
whose header and streams are rewritten and then re-signed (a crafted patch passes every
checksum and reaches the stream decoders), and crafted safetensors anchors.
"""

from __future__ import annotations

import json
import struct

import pytest
import torch
import zstandard
from hypothesis import assume, given
from hypothesis import strategies as st

from resources.store.tensors import tensors_from_bytes, tensors_to_bytes
from tests.fuzz.fuzzing import FUZZ, count_input
from workers.pulse import PatchError, apply_patch, encode_patch, read_patch_header, sync_weights, weights_hash
from workers.pulse.chain import MemoryChain
from workers.pulse.patch_format import pack_patch


def _pair(seed: int) -> tuple[dict, dict]:
    generator = torch.Generator().manual_seed(seed)
    prev = {
        "a": (torch.randn(300, generator=generator) * 0.02).to(torch.bfloat16),
        "b": (torch.randn(20, 10, generator=generator) * 0.02).to(torch.bfloat16),
    }
    cur = {name: tensor.clone() for name, tensor in prev.items()}
    cur["a"].view(torch.int16)[::3] += 1
    cur["b"].view(torch.int16).view(-1)[::40] -= 300  # some gaps escape a byte, some deltas need 16 bits
    return prev, cur


PAIR = _pair(0)
PATCHES = {mode: encode_patch(*PAIR, base_version=0, version=1, mode=mode) for mode in ("absolute", "ulp_delta")}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
edge_ints = st.sampled_from(
    [0, 1, -1, 2, 7, 255, 256, 65535, 65536, 2**31, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64]
)


def _receiver() -> dict:
    return {name: tensor.clone() for name, tensor in PAIR[0].items()}


def _apply_or_refuse(patch: bytes) -> None:
    """The property of a crafted, correctly signed patch: applying either raises PatchError with the weights
    unchanged, or writes only into the tensors the header names, keeping every name, shape and dtype."""
    count_input("pulse_patch")
    receiver = _receiver()
    before = weights_hash(receiver)
    try:
        apply_patch(receiver, patch, base_version=0)
    except PatchError:
        assert weights_hash(receiver) == before
        return
    named = {entry.name for entry in read_patch_header(patch).tensors}
    for name, tensor in receiver.items():
        assert (tensor.shape, tensor.dtype) == (PAIR[0][name].shape, PAIR[0][name].dtype), name
        assert name in named or torch.equal(tensor.view(torch.int16), PAIR[0][name].view(torch.int16)), name


def _refused(patch: bytes) -> None:
    """The property of damaged bytes: applying must raise PatchError and leave the weights unchanged."""
    count_input("pulse_patch")
    receiver = _receiver()
    before = weights_hash(receiver)
    with pytest.raises(PatchError):
        apply_patch(receiver, patch, base_version=0)
    assert weights_hash(receiver) == before


def _header_and_payload(patch: bytes) -> tuple[dict, bytes]:
    header = read_patch_header(patch)
    raw = json.loads(zstandard.ZstdDecompressor().decompress(patch[22 : header.header_size]))
    return raw, patch[header.header_size :]


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes_are_refused_as_patches(data: bytes) -> None:
    _refused(data)


@FUZZ
@given(st.sampled_from(sorted(PATCHES)), st.data())
def test_damaged_patches_are_refused_untouched(mode: str, data: st.DataObject) -> None:
    patch = bytearray(PATCHES[mode])
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(patch) - 1))
        patch[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(patch)))
    damaged = bytes(patch[:cut]) + data.draw(st.binary(max_size=8))
    assume(damaged != PATCHES[mode])  # every other byte string is damage, whatever byte it hit: refused
    _refused(damaged)


@pytest.mark.parametrize("mode", sorted(PATCHES))
def test_one_flipped_bit_anywhere_is_refused(mode: str) -> None:
    """Every byte of the prefix and the header (both checksums included), and 32 spread over the payload."""
    patch = PATCHES[mode]
    start = read_patch_header(patch).header_size
    for at in [*range(start), *range(start, len(patch), max(1, (len(patch) - start) // 32))]:
        for bit in (0, 7):
            damaged = bytearray(patch)
            damaged[at] ^= 1 << bit
            _refused(bytes(damaged))


@FUZZ
@given(st.sampled_from(sorted(PATCHES)), st.data())
def test_resigned_patches_with_rewritten_headers_are_applied_or_refused_untouched(
    mode: str, data: st.DataObject
) -> None:
    header, payload = _header_and_payload(PATCHES[mode])
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(["top", "stream", "tensor"]))
        if where == "top":
            header[data.draw(st.sampled_from(sorted(header)))] = data.draw(json_values | edge_ints)
        else:
            entries = header["streams" if where == "stream" else "tensors"]
            if isinstance(entries, list) and entries:
                entry = entries[data.draw(st.integers(0, len(entries) - 1))]
                if isinstance(entry, dict) and entry:
                    key = data.draw(st.sampled_from(sorted(entry)))
                    entry[key] = data.draw(edge_ints | json_values | st.lists(edge_ints, max_size=3))
    _apply_or_refuse(pack_patch(header, payload))


@FUZZ
@given(st.sampled_from(sorted(PATCHES)), st.data())
def test_resigned_patches_with_crafted_streams_are_applied_or_refused_untouched(mode: str, data: st.DataObject) -> None:
    header, payload = _header_and_payload(PATCHES[mode])
    frames = [payload[s["offset"] : s["offset"] + s["length"]] for s in header["streams"]]
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(frames) - 1))
        stream = header["streams"][index]
        raw = data.draw(
            st.binary(max_size=200)
            | st.builds(lambda b, n: b * n, st.binary(min_size=1, max_size=8), st.integers(1, 4000))
        )
        frames[index] = zstandard.ZstdCompressor().compress(raw) if data.draw(st.booleans()) else raw
        width = {"uint8": 1, "uint16": 2, "uint64": 8, "bool": 1}[stream["dtype"]]
        stream["count"] = data.draw(st.sampled_from([len(raw) // width, len(raw) * 8, 0]) | edge_ints)
    offset = 0
    for stream, frame in zip(header["streams"], frames, strict=False):
        stream["offset"], stream["length"] = offset, len(frame)
        offset += len(frame)
    _apply_or_refuse(pack_patch(header, b"".join(frames)))


@FUZZ
@given(st.integers(0, 4), st.data())
def test_a_chain_with_a_crafted_patch_is_refused_with_a_patch_error(bad: int, data: st.DataObject) -> None:
    chain = MemoryChain(anchors={0: PAIR[0]}, patches={v: PATCHES["absolute"] for v in range(1, 6)})
    chain.patches[bad + 1] = data.draw(st.binary(max_size=64))
    count_input("pulse_chain")
    with pytest.raises(PatchError):
        sync_weights({}, None, 5, chain)


def _safetensors(header: object, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


anchor_headers = st.dictionaries(
    st.text(max_size=6),
    st.fixed_dictionaries(
        {
            "dtype": st.sampled_from(["BF16", "F32", "I64", "U8", "BOOL", "F8_E4M3", "XX"]),
            "shape": st.lists(edge_ints | st.integers(0, 40), max_size=3),
            "data_offsets": st.lists(edge_ints | st.integers(0, 400), min_size=0, max_size=3),
        }
    )
    | json_values,
    max_size=3,
)


@FUZZ
@given(st.binary(max_size=300) | st.builds(_safetensors, anchor_headers, st.binary(max_size=400)))
def test_anchor_bytes_load_or_raise_value_error(data: bytes) -> None:
    count_input("anchor")
    try:
        tensors = tensors_from_bytes(data)
    except ValueError:
        return
    assert all(isinstance(t, torch.Tensor) for t in tensors.values())


def test_a_real_anchor_still_loads() -> None:
    assert weights_hash(tensors_from_bytes(tensors_to_bytes(PAIR[0]))) == weights_hash(PAIR[0])


@pytest.mark.parametrize("mode", sorted(PATCHES))
def test_the_undamaged_patches_apply_to_the_target_weights(mode: str) -> None:
    receiver = _receiver()
    apply_patch(receiver, PATCHES[mode], base_version=0)
    assert weights_hash(receiver) == weights_hash(PAIR[1]) != weights_hash(PAIR[0])
