import pytest
import torch

from workers.grpo import GRPOConfig
from workers.sampler import SamplerConfig, step_log_prob
from workers.trainer import GRPOTrainer, TrainConfig, iteration_prompts, request_seed


def _config(**grpo):
    return TrainConfig(prompts_per_iteration=2, group_size=4, reward="jpeg_compressibility",
                       sampler=SamplerConfig(num_steps=4), grpo=GRPOConfig(**grpo))


def _advantage_weighted_log_prob(trainer, batch) -> float:
    traj, cfg = batch.trajectory, trainer.config.sampler
    with torch.no_grad():
        emb, mask = trainer.policy.encode_prompts(traj.prompts)
        total = 0.0
        for t in cfg.sde_steps:
            lp, _, _ = step_log_prob(trainer.policy, traj.latents, t, emb, mask, cfg)
            total += float((batch.advantages * lp).sum())
    return total


def test_a_grpo_update_raises_the_log_prob_of_better_than_average_samples(tiny_policy):
    trainer = GRPOTrainer(tiny_policy, _config(lr=1e-3, clip_range=10.0, num_minibatches=1))
    batch = trainer.collect(0)
    assert batch.advantages.abs().sum() > 0
    before = _advantage_weighted_log_prob(trainer, batch)
    trainer.update(batch)
    assert _advantage_weighted_log_prob(trainer, batch) > before


def test_first_minibatch_is_on_policy_so_nothing_is_clipped(tiny_policy):
    trainer = GRPOTrainer(tiny_policy, _config(num_minibatches=1))
    stats = trainer.update(trainer.collect(0))
    assert stats["clip_frac"] == 0.0 and stats["approx_kl"] == 0.0


def test_kl_penalty_uses_a_frozen_reference(tiny_policy):
    trainer = GRPOTrainer(tiny_policy, _config(lr=1e-3, kl_beta=0.1, num_minibatches=1))
    ref_before = [p.clone() for p in trainer.reference.parameters()]
    batch = trainer.collect(0)
    trainer.update(batch)
    stats = trainer.update(batch)
    assert stats["kl"] > 0
    assert all(torch.equal(a, b) for a, b in zip(ref_before, trainer.reference.parameters()))


def test_prompts_and_seeds_are_a_pure_function_of_run_seed_and_iteration():
    assert iteration_prompts(0, 3, 8) == iteration_prompts(0, 3, 8)
    assert iteration_prompts(0, 3, 8) != iteration_prompts(0, 4, 8)
    assert request_seed(0, 1, 2, 3) == request_seed(0, 1, 2, 3) != request_seed(0, 1, 2, 4)


def test_config_refuses_more_minibatches_than_samples():
    with pytest.raises(ValueError, match="num_minibatches"):
        TrainConfig(prompts_per_iteration=1, group_size=2, grpo=GRPOConfig(num_minibatches=4))


def test_train_categories_restrict_the_prompt_schedule():
    from workers.prompts import parse_prompt

    prompts = [p for it in range(6) for p in iteration_prompts(0, it, 8, ("counting", "position"))]
    assert {parse_prompt(p).category for p in prompts} == {"counting", "position"}


def test_an_unknown_train_category_is_refused_before_compute():
    with pytest.raises(ValueError, match="train_categories"):
        TrainConfig(train_categories=("counting", "colour_binding"))
