"""The real preset, end to end from the shipped base (slow: about a minute on 2 cores)."""

import dataclasses

import pytest

from workers.policy import load_policy
from workers.presets import get_preset
from workers.train_loop import run_training


@pytest.mark.slow
def test_cpu_tiny_preset_trains_from_the_shipped_base_and_moves_the_weights():
    policy = load_policy()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    config = dataclasses.replace(get_preset("cpu_tiny"), iterations=2, validate_every=2)
    records = list(run_training(policy, config))
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert records[0]["validation_score"] is not None and records[2]["validation_score"] is not None
    assert all(0.0 <= r["reward_mean"] <= 1.0 and r["zero_std_ratio"] < 1.0 for r in records[1:])
    changed = sum(not (before[k] == v).all() for k, v in policy.state_dict().items())
    assert changed > len(before) // 2  # GRPO updated most tensors
