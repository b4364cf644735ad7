"""Every refused PULSE patch raises PatchError and leaves the receiver's weights untouched."""

from __future__ import annotations

import json
import struct

import pytest
import torch
import zstandard

from workers.pulse import PatchError, apply_patch, encode_patch, read_patch_header, weights_hash
from workers.pulse.patch_format import PREFIX, pack_patch


def make_pair(seed: int = 0) -> tuple[dict, dict]:
    """Three tensors that all change, so a refusal triggered by the last one would show on the first."""
    generator = torch.Generator().manual_seed(seed)
    prev = {
        "a": (torch.randn(1000, generator=generator) * 0.02).to(torch.bfloat16),
        "b": (torch.randn(50, 20, generator=generator) * 0.02).to(torch.bfloat16),
        "z": (torch.randn(64, generator=generator) * 0.02).to(torch.bfloat16),
    }
    cur = {name: tensor.clone() for name, tensor in prev.items()}
    for tensor in cur.values():
        tensor.view(torch.int16).view(-1)[::7] += 1
    return prev, cur


def assert_refused_untouched(receiver: dict, patch: bytes, match: str, **kwargs) -> None:
    before = weights_hash(receiver)
    with pytest.raises(PatchError, match=match):
        apply_patch(receiver, patch, **kwargs)
    assert weights_hash(receiver) == before


@pytest.fixture(params=["absolute", "ulp_delta"])
def pair_and_patch(request) -> tuple[dict, dict, bytes]:
    prev, cur = make_pair()
    return prev, cur, encode_patch(prev, cur, base_version=4, version=5, mode=request.param)


def receiver_of(prev: dict) -> dict:
    return {name: tensor.clone() for name, tensor in prev.items()}


@pytest.mark.parametrize("keep", [0, 10, PREFIX.size + 5, -1])
def test_truncated_patch_is_refused_and_weights_stay_unchanged(pair_and_patch, keep: int) -> None:
    prev, _, patch = pair_and_patch
    assert_refused_untouched(receiver_of(prev), patch[:keep], match="truncated|payload")


def test_corrupted_payload_byte_is_refused_by_the_checksum(pair_and_patch) -> None:
    prev, _, patch = pair_and_patch
    corrupted = bytearray(patch)
    corrupted[-3] ^= 0x10
    assert_refused_untouched(receiver_of(prev), bytes(corrupted), match="payload corrupted")


def test_corrupted_header_byte_is_refused_by_the_checksum(pair_and_patch) -> None:
    prev, _, patch = pair_and_patch
    corrupted = bytearray(patch)
    corrupted[PREFIX.size + 20] ^= 0x01
    assert_refused_untouched(receiver_of(prev), bytes(corrupted), match="header corrupted")


def test_data_that_is_not_a_patch_is_refused(pair_and_patch) -> None:
    prev, _, patch = pair_and_patch
    assert_refused_untouched(receiver_of(prev), b"NOTPULSE" + patch[8:], match="not a PULSE patch")


def test_unsupported_format_version_is_refused(pair_and_patch) -> None:
    prev, _, patch = pair_and_patch
    newer = patch[:8] + struct.pack("<H", 2) + patch[10:]
    assert_refused_untouched(receiver_of(prev), newer, match="unsupported patch format version 2")


def test_wrong_base_version_is_refused(pair_and_patch) -> None:
    prev, _, patch = pair_and_patch
    assert_refused_untouched(receiver_of(prev), patch, match="from version 4, receiver is at version 3", base_version=3)


def test_ulp_delta_refuses_a_receiver_whose_hash_differs_from_the_base() -> None:
    prev, cur = make_pair()
    patch = encode_patch(prev, cur, base_version=0, version=1, mode="ulp_delta")
    receiver = receiver_of(prev)
    receiver["b"].view(torch.int16)[0, 0] += 1  # one bit pattern off, in a tensor the patch touches
    assert_refused_untouched(receiver, patch, match="base hash")
    applied_twice = receiver_of(prev)
    apply_patch(applied_twice, patch)
    assert_refused_untouched(applied_twice, patch, match="base hash")


def test_unknown_tensor_name_is_refused(pair_and_patch) -> None:
    prev, _, patch = pair_and_patch
    receiver = receiver_of(prev)
    receiver["y"] = receiver.pop("z")
    assert_refused_untouched(receiver, patch, match="'z', which the receiver does not hold")


def test_shape_mismatch_is_refused(pair_and_patch) -> None:
    prev, _, patch = pair_and_patch
    receiver = receiver_of(prev)
    receiver["z"] = receiver["z"].view(8, 8)
    assert_refused_untouched(receiver, patch, match="receiver shape")


def test_dtype_mismatch_is_refused(pair_and_patch) -> None:
    prev, _, patch = pair_and_patch
    receiver = receiver_of(prev)
    receiver["z"] = receiver["z"].float()
    assert_refused_untouched(receiver, patch, match="receiver dtype")


def test_non_contiguous_receiver_tensor_is_refused(pair_and_patch) -> None:
    prev, _, patch = pair_and_patch
    receiver = receiver_of(prev)
    receiver["b"] = receiver["b"].T.contiguous().T
    assert_refused_untouched(receiver, patch, match="not contiguous")


def recrafted(patch: bytes, edit) -> bytes:
    """The same payload under an edited header, with valid checksums: only structure checks can refuse it."""
    header = read_patch_header(patch)
    raw = json.loads(zstandard.ZstdDecompressor().decompress(patch[PREFIX.size : header.header_size]))
    edit(raw)
    for key in ("payload_size", "payload_xxh3_128"):
        raw.pop(key)
    return pack_patch(raw, patch[header.header_size :])


def _grow_count(raw: dict) -> None:
    raw["tensors"][0]["count"] += 1


def _swap_offsets(raw: dict) -> None:
    first, second = raw["tensors"][0]["offsets"], raw["tensors"][1]["offsets"]
    raw["tensors"][0]["offsets"], raw["tensors"][1]["offsets"] = second, first


def _drop_stream(raw: dict) -> None:
    raw["streams"].pop()


def _unknown_mode(raw: dict) -> None:
    raw["mode"] = "xor"


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_grow_count, "positions decoded, header says"),
        (_swap_offsets, "offsets go backwards"),
        (_drop_stream, "streams do not match"),
        (_unknown_mode, "unknown patch mode"),
    ],
)
def test_structurally_inconsistent_patch_with_valid_checksums_is_refused(pair_and_patch, edit, match: str) -> None:
    prev, _, patch = pair_and_patch
    assert_refused_untouched(receiver_of(prev), recrafted(patch, edit), match=match)


def test_patch_whose_indices_run_past_the_tensor_is_refused() -> None:
    # Absolute mode: ulp_delta would already refuse this receiver for its base hash.
    prev, cur = make_pair()
    patch = encode_patch(prev, cur, base_version=4, version=5)

    def shrink_first_tensor(raw: dict) -> None:
        raw["tensors"][0]["shape"] = [500]

    receiver = receiver_of(prev)
    receiver["a"] = receiver["a"][:500].clone()
    assert_refused_untouched(receiver, recrafted(patch, shrink_first_tensor), match="out of range")


def test_read_patch_header_refuses_what_apply_refuses(pair_and_patch) -> None:
    _, _, patch = pair_and_patch
    with pytest.raises(PatchError):
        read_patch_header(patch[:-1])
    assert read_patch_header(patch).version == 5
