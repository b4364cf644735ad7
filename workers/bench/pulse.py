"""`spotlight bench pulse`: PULSESync sparsity, patch size and speed on real weight trajectories.

Example:
    figures = run_pulse_bench(quick=True)            # the LM-shaped model, built here
    figures = bench_trajectory(trainer_snapshots)    # any iterable of successive state dicts
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field

import torch

from workers.bench.pulse_stats import (
    MODES,
    dense_bytes,
    entropy_floor,
    patch_sizes,
    single_thread,
    synthetic_update,
    timed_roundtrip,
    zstd_levels,
)
from workers.pulse.loco.tiny_lm import TrajectoryConfig, lm_50m, lm_tiny, lm_trajectory, num_parameters
from workers.pulse.weights_hash import as_bf16

log = logging.getLogger(__name__)
TARGETS = {
    "absolute_bytes_per_changed": ("<=", 2.5),
    "ulp_delta_bytes_per_changed": ("<=", 1.6),
    "absolute_ratio_at_1pct_changed": (">=", 80.0),
    "absolute_encode_gbps": (">=", 1.0),
    "absolute_apply_gbps": (">=", 2.0),
    "ulp_delta_encode_gbps": (">=", 1.0),
    "ulp_delta_apply_gbps": (">=", 2.0),
}
"""The PULSESync targets at lr 3e-6 (throughput: GB/s of dense BF16 model on one core)."""


@dataclass(frozen=True)
class BenchConfig:
    """What bench_trajectory measures."""

    ks: tuple[int, ...] = (1, 8, 32)
    """Steps between syncs to compare."""
    detailed_pairs: int = 3
    """k=1 pairs that also get timings and the entropy floor."""
    repeats: int = 3
    """Timing repeats per detailed pair (median reported, best too)."""
    zstd_levels: tuple[int, ...] = (-1, 1, 3, 9, 19)
    """Levels compared on the first k=1 pair."""

    def __post_init__(self) -> None:
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"ks must be non-empty and >= 1, got {self.ks}")
        if self.detailed_pairs < 1 or self.repeats < 1:
            raise ValueError("detailed_pairs and repeats must be >= 1")


@dataclass
class _PairLog:
    """Per-k running totals."""

    fractions: list[float] = field(default_factory=list)
    changed: int = 0
    dense: int = 0
    absolute_bytes: int = 0
    ulp_delta_bytes: int = 0

    def add(self, sizes: dict) -> None:
        self.fractions.append(sizes["changed"] / sizes["numel"])
        self.changed += sizes["changed"]
        self.dense += 2 * sizes["numel"]
        self.absolute_bytes += sizes["absolute_bytes"]
        self.ulp_delta_bytes += sizes["ulp_delta_bytes"]

    def summary(self) -> dict:
        out = {"num_pairs": len(self.fractions)}
        if not self.fractions:
            return out
        out["changed_fraction_mean"] = sum(self.fractions) / len(self.fractions)
        out["changed_fraction_min"] = min(self.fractions)
        out["changed_fraction_max"] = max(self.fractions)
        for mode in MODES:
            size = getattr(self, f"{mode}_bytes")
            out[f"{mode}_bytes_per_changed"] = size / max(1, self.changed)
            out[f"{mode}_ratio_vs_dense"] = self.dense / size
        return out


def bench_trajectory(states: Iterable[Mapping[str, torch.Tensor]], config: BenchConfig = BenchConfig()) -> dict:
    """Figures for successive weight versions (BF16, or FP32 cast as the forward pass does).

    Streams through `states`, holding at most one saved version per k. For each k,
    pairs (t - k, t) at t divisible by k; the first `detailed_pairs` k=1 pairs also get
    single-thread encode/apply throughput and the entropy floor.
    """
    logs = {k: _PairLog() for k in config.ks}
    saved: dict[int, dict[str, torch.Tensor]] = {}
    detailed: list[dict] = []
    levels: dict = {}
    prev = None
    for step, state in enumerate(states):
        cur = {name: as_bf16(tensor, name) for name, tensor in state.items()}
        if prev is not None and 1 in logs:
            logs[1].add(patch_sizes(prev, cur))
            if len(detailed) < config.detailed_pairs:
                detailed.append(_detailed_pair(prev, cur, config.repeats))
            if not levels:
                levels = _per_changed(zstd_levels(prev, cur, config.zstd_levels), detailed[0]["changed"])
        for k in (k for k in config.ks if k > 1 and step % k == 0):
            if k in saved:
                logs[k].add(patch_sizes(saved[k], cur))
            saved[k] = cur
        prev = cur
        if step % 16 == 0:
            log.info("pulse bench: %d states measured", step + 1)
    return {
        "num_states": step + 1 if prev is not None else 0,
        "dense_bytes": dense_bytes(prev) if prev is not None else 0,
        "by_k": {str(k): log.summary() for k, log in logs.items()},
        "detailed_k1": _mean_of(detailed),
        "zstd_levels_k1": levels,
        "bitwise_exact": all(pair["absolute_bitwise_exact"] and pair["ulp_delta_bitwise_exact"] for pair in detailed),
    }


def _detailed_pair(prev: dict, cur: dict, repeats: int) -> dict:
    """Sizes, entropy floor and single-thread throughput of one pair, in both modes."""
    sizes = patch_sizes(prev, cur)
    out = {"changed": sizes["changed"], "changed_fraction": sizes["changed"] / sizes["numel"]}
    for mode in MODES:
        out[f"{mode}_bytes_per_changed"] = sizes[f"{mode}_bytes"] / max(1, sizes["changed"])
        out[f"{mode}_ratio_vs_dense"] = 2 * sizes["numel"] / sizes[f"{mode}_bytes"]
        timing = timed_roundtrip(prev, cur, mode, repeats)
        out.update({f"{mode}_{key}": value for key, value in timing.items() if key != "hash_gbps"})
        out["hash_gbps"] = timing["hash_gbps"]
    out.update({f"entropy_floor_{key}": value for key, value in entropy_floor(prev, cur).items()})
    return out


def _per_changed(levels: dict, changed: int) -> dict:
    for row in levels.values():
        for mode in MODES:
            row[f"{mode}_bytes_per_changed"] = row.pop(f"{mode}_bytes") / max(1, changed)
    return levels


def _mean_of(rows: list[dict]) -> dict:
    """Mean of each numeric figure over rows (booleans: all true)."""
    if not rows:
        return {}
    out: dict = {"num_pairs": len(rows)}
    for key in rows[0]:
        values = [row[key] for row in rows]
        out[key] = all(values) if isinstance(values[0], bool) else sum(values) / len(values)
    return out


DIT_LRS = (3e-6, 5e-5)
"""GRPO learning rates for the tiny DiT: PULSE's RL regime, and the cpu_tiny recipe's."""


def run_dit_bench(quick: bool = False) -> dict:
    """(a) The shipped tiny DiT under real GRPO updates, one trajectory per learning rate."""
    from workers.bench.dit_trajectory import dit_grpo_states

    num_states = 3 if quick else 33
    config = BenchConfig(
        ks=(1,) if quick else (1, 8, 32), detailed_pairs=1, repeats=1 if quick else 3, zstd_levels=(1,)
    )
    with single_thread():
        return {
            f"lr={lr:g}": bench_trajectory(dit_grpo_states(num_states, lr), config)
            for lr in (DIT_LRS[:1] if quick else DIT_LRS)
        }


def run_pulse_bench(quick: bool = False, dit: bool = True) -> dict:
    """(b) The LM-shaped benchmark (train, stream snapshots into bench_trajectory, add the 1 %
    micro-benchmark) and, unless dit=False, (a) the tiny DiT's own GRPO updates."""
    model, run = (lm_tiny(), quick_trajectory()) if quick else (lm_50m(), TrajectoryConfig())
    config = BenchConfig(detailed_pairs=2, repeats=2, zstd_levels=(-1, 1, 3, 19)) if quick else BenchConfig()
    start = time.perf_counter()
    last: dict = {}
    # One thread throughout: the throughput targets are per core, and on a shared 2-core
    # machine a second torch thread waiting on a busy core made each step ~15x slower.
    with single_thread():
        figures = bench_trajectory(_remember_last(lm_trajectory(model, run), last), config)
        figures["synthetic_1pct"] = _detailed_pair(last["state"], synthetic_update(last["state"], 0.01), config.repeats)
    figures["model"] = {"num_parameters": num_parameters(model), **asdict(model)}
    figures["trajectory"] = asdict(run)
    figures["quick"] = quick
    figures["targets"] = check_targets(figures)
    if dit:
        figures["dit_grpo"] = run_dit_bench(quick)
    figures["wall_s"] = time.perf_counter() - start
    return figures


def quick_trajectory() -> TrajectoryConfig:
    """Enough states for k=32 on the tiny model, in seconds."""
    return TrajectoryConfig(warmup_steps=10, settle_steps=10, num_states=33)


def _remember_last(states: Iterable[dict], memo: dict) -> Iterator[dict]:
    for state in states:
        memo["state"] = state
        yield state


def check_targets(figures: dict) -> dict:
    """Each target with the measured value (k=1 trajectory; ratio from the 1 % micro-benchmark)."""
    k1, detailed = figures["by_k"].get("1", {}), figures["detailed_k1"]
    measured = {
        "absolute_bytes_per_changed": k1.get("absolute_bytes_per_changed"),
        "ulp_delta_bytes_per_changed": k1.get("ulp_delta_bytes_per_changed"),
        "absolute_ratio_at_1pct_changed": figures["synthetic_1pct"]["absolute_ratio_vs_dense"],
        "absolute_encode_gbps": detailed.get("absolute_encode_gbps"),
        "absolute_apply_gbps": detailed.get("absolute_apply_gbps"),
        "ulp_delta_encode_gbps": detailed.get("ulp_delta_encode_gbps"),
        "ulp_delta_apply_gbps": detailed.get("ulp_delta_apply_gbps"),
    }
    out = {}
    for name, (op, target) in TARGETS.items():
        value = measured[name]
        met = value is not None and (value <= target if op == "<=" else value >= target)
        out[name] = {"value": value, "target": f"{op} {target}", "met": met}
    return out
