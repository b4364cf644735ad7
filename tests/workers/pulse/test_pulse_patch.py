"""PULSESync patches: bit-exact round trips, idempotence and the edge cases of the format."""

from __future__ import annotations

import pytest
import torch

from workers.pulse import apply_patch, encode_patch, read_patch_header, weights_hash

MODES = ("absolute", "ulp_delta")


def clone(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in weights.items()}


def bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.view(torch.int16)


def roundtrip(prev: dict, cur: dict, mode: str) -> dict:
    """Encode prev -> cur, apply to a copy of prev, return the receiver's weights."""
    patch = encode_patch(prev, cur, base_version=0, version=1, mode=mode)
    receiver = clone(prev)
    apply_patch(receiver, patch, base_version=0)
    return receiver


def assert_bitwise_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(bits(got[name]), bits(want[name])), name
    assert weights_hash(got) == weights_hash(want)


def random_bf16(*shape: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)


def perturb(tensor: torch.Tensor, share: float, seed: int) -> torch.Tensor:
    """Nudge a random share of values by one or two ULPs (bit-pattern steps)."""
    generator = torch.Generator().manual_seed(seed)
    out = tensor.clone()
    flat = bits(out).view(-1)
    chosen = torch.rand(flat.numel(), generator=generator) < share
    steps = torch.randint(1, 3, (flat.numel(),), generator=generator, dtype=torch.int16)
    signs = torch.where(torch.rand(flat.numel(), generator=generator) < 0.5, -1, 1).to(torch.int16)
    flat[chosen] += (steps * signs)[chosen]
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("share", [0.0005, 0.01, 0.05, 0.3])
def test_patch_roundtrip_is_bitwise_exact_on_random_sparse_updates(mode: str, share: float) -> None:
    prev = {"w": random_bf16(256, 384, seed=1), "b": random_bf16(384, seed=2), "emb": random_bf16(1000, 64, seed=3)}
    cur = {name: perturb(tensor, share, seed=i) for i, (name, tensor) in enumerate(prev.items())}
    assert_bitwise_equal(roundtrip(prev, cur, mode), cur)


@pytest.mark.parametrize("mode", MODES)
def test_patch_without_changes_is_valid_and_changes_nothing(mode: str) -> None:
    prev = {"w": random_bf16(64, 64), "s": torch.tensor(0.5, dtype=torch.bfloat16)}
    patch = encode_patch(prev, clone(prev), base_version=3, version=4, mode=mode)
    header = read_patch_header(patch)
    assert header.num_changed == 0 and header.tensors == ()
    assert len(patch) < 1024
    assert_bitwise_equal(roundtrip(prev, clone(prev), mode), prev)


@pytest.mark.parametrize("mode", MODES)
def test_patch_with_every_value_changed_roundtrips(mode: str) -> None:
    prev = {"w": random_bf16(300, 70, seed=4)}
    generator = torch.Generator().manual_seed(5)
    cur_bits = torch.randint(-32768, 32767, (300, 70), generator=generator, dtype=torch.int16)
    cur_bits[cur_bits == bits(prev["w"])] += 1
    cur = {"w": cur_bits.view(torch.bfloat16)}
    assert read_patch_header(encode_patch(prev, cur, base_version=0, version=1, mode=mode)).num_changed == 300 * 70
    assert_bitwise_equal(roundtrip(prev, cur, mode), cur)


@pytest.mark.parametrize("mode", MODES)
def test_special_bit_patterns_nan_inf_and_negative_zero_roundtrip(mode: str) -> None:
    special = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1.0, -1.0, 1e-40]
    prev_bits = torch.tensor(special, dtype=torch.bfloat16).view(torch.int16).clone()
    # Distinct NaN payloads and 0.0 <-> -0.0 differ only in bits, which is what PULSE compares.
    cur_bits = torch.tensor(
        [-0.0, 0.0, float("-inf"), float("inf"), 1.0, float("nan"), -1.0, 0.0], dtype=torch.bfloat16
    )
    cur_bits = cur_bits.view(torch.int16).clone()
    cur_bits[5] = 0x7FC1  # a NaN with another payload
    nan_payloads = torch.tensor([0x7FC1, 0x7FC3, -1, 0x7F81], dtype=torch.int16)
    prev = {"s": prev_bits.view(torch.bfloat16), "n": nan_payloads.view(torch.bfloat16)}
    cur = {"s": cur_bits.view(torch.bfloat16), "n": nan_payloads.flip(0).view(torch.bfloat16)}
    assert_bitwise_equal(roundtrip(prev, cur, mode), cur)


@pytest.mark.parametrize("mode", MODES)
def test_zero_dim_tensors_roundtrip(mode: str) -> None:
    prev = {"scale": torch.tensor(0.25, dtype=torch.bfloat16), "w": random_bf16(8)}
    cur = {"scale": torch.tensor(-3.5, dtype=torch.bfloat16), "w": prev["w"].clone()}
    assert_bitwise_equal(roundtrip(prev, cur, mode), cur)


@pytest.mark.parametrize("mode", MODES)
def test_changes_at_first_and_last_index_and_gaps_beyond_65535_roundtrip(mode: str) -> None:
    prev = {"big": random_bf16(3_000_000, seed=6)}
    cur = clone(prev)
    flat = bits(cur["big"])
    # Gaps of 0, 65534, 65535 (the escape value itself), 65536, 200000 and the rest.
    positions = [0, 1, 65536, 131072, 196609, 396610, 2_999_998, 2_999_999]
    flat[positions] += 1
    patch = encode_patch(prev, cur, base_version=0, version=1, mode=mode)
    assert read_patch_header(patch).num_changed == len(positions)
    assert_bitwise_equal(roundtrip(prev, cur, mode), cur)


def positions_from_gaps(gaps: list[int]) -> torch.Tensor:
    return torch.cumsum(torch.tensor(gaps) + 1, 0) - 1


@pytest.mark.parametrize("mode", MODES)
def test_gaps_equal_to_the_escape_values_roundtrip_in_both_gap_widths(mode: str) -> None:
    # Mostly dense changes keep the 1-byte first level; the sparse tensor takes the 2-byte one.
    dense_gaps = [0] * 1000 + [255, 255 + 65535, 256, 255 + 65536, 254, 65535, 0]
    sparse_gaps = [65535, 65534, 65536, 0, 200_000, 65535 + 65535]
    prev = {"dense": random_bf16(300_000, seed=7), "sparse": random_bf16(600_000, seed=8)}
    cur = clone(prev)
    bits(cur["dense"])[positions_from_gaps(dense_gaps)] -= 1
    bits(cur["sparse"])[positions_from_gaps(sparse_gaps)] += 1
    header = read_patch_header(encode_patch(prev, cur, base_version=0, version=1, mode=mode))
    assert {t.name: t.gap_width for t in header.tensors} == {"dense": 1, "sparse": 2}
    assert_bitwise_equal(roundtrip(prev, cur, mode), cur)


def test_float32_master_weights_are_cast_to_bf16_as_the_forward_pass_does() -> None:
    generator = torch.Generator().manual_seed(8)
    master_prev = torch.randn(128, 128, generator=generator) * 0.02
    master_cur = master_prev - 3e-4 * torch.randn(128, 128, generator=generator).sign()
    prev, cur = {"w": master_prev.to(torch.bfloat16)}, {"w": master_cur}
    patch = encode_patch({"w": master_prev}, cur, base_version=0, version=1)
    receiver = clone(prev)
    apply_patch(receiver, patch)
    assert_bitwise_equal(receiver, {"w": master_cur.to(torch.bfloat16)})


def test_absolute_patch_applied_twice_gives_the_same_weights() -> None:
    prev = {"w": random_bf16(200, 200, seed=9), "b": random_bf16(200, seed=10)}
    cur = {name: perturb(tensor, 0.02, seed=11) for name, tensor in prev.items()}
    patch = encode_patch(prev, cur, base_version=0, version=1)
    receiver = clone(prev)
    apply_patch(receiver, patch)
    apply_patch(receiver, patch)
    assert_bitwise_equal(receiver, cur)


def test_ulp_delta_patch_is_smaller_than_absolute_on_one_ulp_updates() -> None:
    prev = {"w": random_bf16(512, 512, seed=12)}
    cur = {"w": perturb(prev["w"], 0.02, seed=13)}
    absolute = encode_patch(prev, cur, base_version=0, version=1, mode="absolute")
    ulp_delta = encode_patch(prev, cur, base_version=0, version=1, mode="ulp_delta")
    assert len(ulp_delta) < 0.75 * len(absolute)


def test_header_describes_the_patch() -> None:
    prev = {"a": random_bf16(100, seed=14), "b": random_bf16(10, 10, seed=15), "c": random_bf16(5, seed=16)}
    cur = clone(prev)
    bits(cur["a"])[[3, 50]] += 1
    bits(cur["b"])[0, 0] -= 1
    patch = encode_patch(prev, cur, base_version=41, version=42, mode="ulp_delta", level=3)
    header = read_patch_header(patch)
    assert (header.base_version, header.version, header.mode, header.zstd_level) == (41, 42, "ulp_delta", 3)
    assert header.base_hash == weights_hash(prev) and header.target_hash == weights_hash(cur)
    assert [(t.name, t.shape, t.count) for t in header.tensors] == [("a", (100,), 2), ("b", (10, 10), 1)]
    assert header.header_size + header.payload_size == len(patch)


def test_encode_rejects_mismatched_inputs_with_a_clear_error() -> None:
    prev = {"w": random_bf16(4, 4)}
    with pytest.raises(ValueError, match="different tensors"):
        encode_patch(prev, {"v": random_bf16(4, 4)}, base_version=0, version=1)
    with pytest.raises(ValueError, match="changed shape"):
        encode_patch(prev, {"w": random_bf16(16)}, base_version=0, version=1)
    with pytest.raises(ValueError, match="base_version < version"):
        encode_patch(prev, clone(prev), base_version=2, version=2)
    with pytest.raises(ValueError, match="dtype"):
        encode_patch(
            {"w": torch.zeros(3, dtype=torch.float16)},
            {"w": torch.ones(3, dtype=torch.float16)},
            base_version=0,
            version=1,
        )
    with pytest.raises(ValueError, match="mode"):
        encode_patch(prev, clone(prev), base_version=0, version=1, mode="delta")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", MODES)
def test_patch_applies_in_place_to_weights_on_a_cuda_device(mode: str) -> None:
    prev_cpu = {"w": random_bf16(1000, 100, seed=17)}
    cur_cpu = {"w": perturb(prev_cpu["w"], 0.05, seed=18)}
    prev = {name: tensor.cuda() for name, tensor in prev_cpu.items()}
    patch = encode_patch(
        prev, {name: tensor.cuda() for name, tensor in cur_cpu.items()}, base_version=0, version=1, mode=mode
    )
    receiver = clone(prev)
    storage = receiver["w"].data_ptr()
    apply_patch(receiver, patch)
    assert receiver["w"].is_cuda and receiver["w"].data_ptr() == storage
    assert_bitwise_equal({name: tensor.cpu() for name, tensor in receiver.items()}, cur_cpu)
