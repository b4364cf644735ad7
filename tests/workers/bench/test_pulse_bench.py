"""The PULSE benchmark measures what it claims on trajectories with a known change rate."""

from __future__ import annotations

import torch

from workers.bench.pulse import BenchConfig, bench_trajectory, check_targets
from workers.bench.pulse_stats import entropy_floor, synthetic_update


def known_trajectory(num_states: int, share: float) -> list[dict[str, torch.Tensor]]:
    """Each state moves a fixed random `share` of the previous state's BF16 values by one ULP."""
    generator = torch.Generator().manual_seed(0)
    state = {"w": (torch.randn(400, 250, generator=generator) * 0.02).to(torch.bfloat16)}
    states = [state]
    for step in range(1, num_states):
        states.append(synthetic_update(states[-1], share, seed=step))
    return states


def test_bench_trajectory_reports_the_change_rate_it_was_given() -> None:
    config = BenchConfig(ks=(1, 4), detailed_pairs=1, repeats=1, zstd_levels=(1, 3))
    figures = bench_trajectory(iter(known_trajectory(9, 0.02)), config)
    k1, k4 = figures["by_k"]["1"], figures["by_k"]["4"]
    assert figures["num_states"] == 9 and k1["num_pairs"] == 8 and k4["num_pairs"] == 2
    assert abs(k1["changed_fraction_mean"] - 0.02) < 0.002
    assert k4["changed_fraction_mean"] > 3 * k1["changed_fraction_mean"]
    assert k1["ulp_delta_bytes_per_changed"] < k1["absolute_bytes_per_changed"]
    assert figures["bitwise_exact"]
    assert set(figures["zstd_levels_k1"]) == {"1", "3"}


def test_entropy_floor_of_one_ulp_steps_is_one_bit_per_delta() -> None:
    prev, cur = known_trajectory(2, 0.05)
    floor = entropy_floor(prev, cur)
    assert abs(floor["delta_bytes_per_changed"] - 1 / 8) < 0.01
    # Uniform positions at 5 %: geometric gaps, entropy about log2(e / 0.05) bits.
    assert 0.65 < floor["index_bytes_per_changed"] < 0.75


def test_targets_report_a_miss_as_not_met() -> None:
    figures = {
        "by_k": {"1": {"absolute_bytes_per_changed": 3.0, "ulp_delta_bytes_per_changed": 1.0}},
        "detailed_k1": {"absolute_encode_gbps": 1.5},
        "synthetic_1pct": {"absolute_ratio_vs_dense": 85.0},
    }
    targets = check_targets(figures)
    assert not targets["absolute_bytes_per_changed"]["met"]
    assert targets["ulp_delta_bytes_per_changed"]["met"] and targets["absolute_encode_gbps"]["met"]
    assert not targets["absolute_apply_gbps"]["met"] and targets["absolute_apply_gbps"]["value"] is None


def test_tiny_dit_grpo_updates_round_trip_bit_exactly(tiny_policy, tmp_path) -> None:
    from workers.bench.dit_trajectory import dit_grpo_states
    from workers.model.tiny_policy import save_policy
    from workers.pulse import apply_patch, encode_patch, weights_hash

    save_policy(tiny_policy, tmp_path / "ckpt")
    states = [
        {k: v.to(torch.bfloat16) for k, v in s.items()}
        for s in dit_grpo_states(
            3, lr=1e-4, checkpoint=tmp_path / "ckpt", prompts_per_iteration=2, reward="jpeg_compressibility"
        )
    ]
    receiver = {k: v.clone() for k, v in states[0].items()}
    for version in (1, 2):
        patch = encode_patch(states[version - 1], states[version], base_version=version - 1, version=version)
        apply_patch(receiver, patch)
        assert weights_hash(receiver) == weights_hash(states[version])
    assert weights_hash(states[2]) != weights_hash(states[0])  # GRPO really moved the weights
