"""Measurements behind `spotlight bench pulse`: patch sizes, entropy floor, single-thread timings."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import torch

from workers.pulse.apply import apply_patch
from workers.pulse.encode import encode_patch
from workers.pulse.streams import changed_indices, gaps_from_indices, ulp_delta_split
from workers.pulse.weights_hash import bf16_bits, weights_hash

MODES = ("absolute", "ulp_delta")
State = Mapping[str, torch.Tensor]


def dense_bytes(state: State) -> int:
    """Size of the model as dense BF16."""
    return 2 * sum(tensor.numel() for tensor in state.values())


@contextlib.contextmanager
def single_thread() -> Iterator[None]:
    """Throughput figures are per core: one torch thread (numpy and zstd here use one anyway)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def patch_sizes(prev: State, cur: State, level: int = 1) -> dict:
    """Changed values and patch bytes in both modes for one pair of versions."""
    numel = sum(tensor.numel() for tensor in cur.values())
    changed = sum(int(np.count_nonzero(bf16_bits(prev[n]) != bf16_bits(cur[n]))) for n in cur)
    sizes = {"numel": numel, "changed": changed}
    for mode in MODES:
        sizes[f"{mode}_bytes"] = len(encode_patch(prev, cur, base_version=0, version=1, mode=mode, level=level))
    return sizes


def entropy_floor(prev: State, cur: State) -> dict:
    """Order-0 empirical entropy of the pooled index-gap, new-value and ULP-delta symbols.

    In bytes per changed value: what an ideal memoryless coder of these symbols would
    spend. zstd may beat it only where symbols repeat in context (it rarely does here).
    """
    gaps, values, deltas = [], [], []
    for name in sorted(cur):
        prev_bits, cur_bits = bf16_bits(prev[name]), bf16_bits(cur[name])
        indices = changed_indices(prev_bits, cur_bits)
        gaps.append(gaps_from_indices(indices))
        values.append(cur_bits[indices])
        negative, magnitude = ulp_delta_split(prev_bits[indices], cur_bits[indices])
        step = magnitude.astype(np.int32) + 1
        deltas.append(np.where(negative, -step, step))
    changed = max(1, sum(g.size for g in gaps))
    index_bytes = _entropy_bits(np.concatenate(gaps)) / 8 / changed
    value_bytes = _entropy_bits(np.concatenate(values)) / 8 / changed
    delta_bytes = _entropy_bits(np.concatenate(deltas)) / 8 / changed
    return {
        "index_bytes_per_changed": index_bytes,
        "value_bytes_per_changed": value_bytes,
        "delta_bytes_per_changed": delta_bytes,
        "absolute_bytes_per_changed": index_bytes + value_bytes,
        "ulp_delta_bytes_per_changed": index_bytes + delta_bytes,
    }


def _entropy_bits(symbols: np.ndarray) -> float:
    if symbols.size == 0:
        return 0.0
    _, counts = np.unique(symbols, return_counts=True)
    return float(-(counts * np.log2(counts / symbols.size)).sum())


def _seconds(
    fn: Callable[[], object], repeats: int, setup: Callable[[], object] | None = None
) -> list[tuple[float, float]]:
    """(wall, process CPU) seconds of `fn` per repeat; `setup` runs untimed before each.

    CPU time is reported beside wall time because this machine's cores are shared:
    wall time includes waiting for a core, CPU time does not.
    """
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def _rates(prefix: str, dense: int, times: list[tuple[float, float]]) -> dict:
    """GB/s of dense model: wall median (the headline), wall best, CPU-time median."""
    walls, cpus = [t[0] for t in times], [t[1] for t in times]
    return {
        f"{prefix}_gbps": dense / statistics.median(walls) / 1e9,
        f"{prefix}_gbps_best": dense / min(walls) / 1e9,
        f"{prefix}_gbps_cpu": dense / max(statistics.median(cpus), 1e-9) / 1e9,
    }


def timed_roundtrip(prev: State, cur: State, mode: str, repeats: int, level: int = 1) -> dict:
    """Single-thread encode and apply throughput and a bit-exactness check."""
    dense = dense_bytes(cur)
    receiver: dict[str, torch.Tensor] = {}

    def fresh_receiver() -> None:
        receiver.clear()
        receiver.update({name: tensor.clone() for name, tensor in prev.items()})

    with single_thread():
        patch = encode_patch(prev, cur, base_version=0, version=1, mode=mode, level=level)
        encode_s = _seconds(lambda: encode_patch(prev, cur, base_version=0, version=1, mode=mode, level=level), repeats)
        apply_s = _seconds(lambda: apply_patch(receiver, patch), repeats, setup=fresh_receiver)
        hash_s = _seconds(lambda: weights_hash(cur), repeats)
    return {
        **_rates("encode", dense, encode_s),
        **_rates("apply", dense, apply_s),
        "hash_gbps": _rates("hash", dense, hash_s)["hash_gbps"],
        "bitwise_exact": weights_hash(receiver) == weights_hash(cur),
    }


def zstd_levels(prev: State, cur: State, levels: tuple[int, ...]) -> dict:
    """Bytes per changed value and single-thread encode speed at each zstd level."""
    dense = dense_bytes(cur)
    out = {}
    with single_thread():
        for level in levels:
            row = {}
            for mode in MODES:
                start = time.perf_counter()
                patch = encode_patch(prev, cur, base_version=0, version=1, mode=mode, level=level)
                row[f"{mode}_encode_gbps"] = dense / (time.perf_counter() - start) / 1e9
                row[f"{mode}_bytes"] = len(patch)
            out[str(level)] = row
    return out


def synthetic_update(state: State, share: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """Move a uniform random `share` of BF16 values by one ULP up or down (the paper's micro-benchmark)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, tensor in state.items():
        new_bits = bf16_bits(tensor).copy()
        chosen = np.flatnonzero(rng.random(new_bits.size) < share)
        step = rng.choice(np.array([-1, 1], dtype=np.int16), chosen.size)
        new_bits[chosen] += step
        out[name] = torch.from_numpy(new_bits).view(torch.bfloat16).reshape(tensor.shape)
    return out
