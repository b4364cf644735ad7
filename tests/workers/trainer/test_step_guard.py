"""A non-finite gradient never reaches the weights: the step is skipped and counted, and a run of them stops the
update."""

from __future__ import annotations

import pytest
import torch

from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig
from workers.trainer.step_guard import NonFiniteGradientError


def _trainer(policy, num_minibatches: int, **kwargs) -> GRPOTrainer:
    config = TrainConfig(
        prompts_per_iteration=2,
        group_size=4,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=4),
        grpo=GRPOConfig(lr=1e-3, num_minibatches=num_minibatches),
    )
    return GRPOTrainer(policy, config, **kwargs)


def _weights(policy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in policy.state_dict().items()}


def test_a_minibatch_with_a_nan_gradient_is_skipped_and_counted(tiny_policy) -> None:
    trainer = _trainer(tiny_policy, num_minibatches=8)  # one sample per minibatch
    batch = trainer.collect(0)
    batch.advantages = batch.advantages.clone()
    batch.advantages[3] = float("nan")
    stats = trainer.update(batch)
    assert stats["skipped_steps"] == 1 and stats["optimizer_steps"] == 7
    assert all(torch.isfinite(v).all() for v in tiny_policy.state_dict().values())
    assert all(torch.isfinite(torch.tensor(v)) for k, v in stats.items())


def test_a_run_of_non_finite_gradients_stops_the_update_with_the_weights_untouched(tiny_policy) -> None:
    trainer = _trainer(tiny_policy, num_minibatches=4, max_consecutive_skips=3)
    batch = trainer.collect(0)
    batch.advantages = torch.full_like(batch.advantages, float("inf"))
    before = _weights(tiny_policy)
    with pytest.raises(NonFiniteGradientError, match="3 optimizer steps in a row had a non-finite gradient"):
        trainer.update(batch)
    assert all(torch.equal(before[k], v) for k, v in tiny_policy.state_dict().items())
    assert not trainer.optimizer.state  # AdamW's moments never saw the bad gradients


def test_a_finite_update_skips_nothing(tiny_policy) -> None:
    trainer = _trainer(tiny_policy, num_minibatches=2)
    stats = trainer.update(trainer.collect(0))
    assert stats["skipped_steps"] == 0 and stats["optimizer_steps"] == 2


def test_the_bound_must_be_at_least_one(tiny_policy) -> None:
    with pytest.raises(ValueError, match="max_consecutive_skips"):
        _trainer(tiny_policy, num_minibatches=1, max_consecutive_skips=0)
