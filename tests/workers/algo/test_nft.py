import dataclasses

import pytest
import torch

from workers.algo.grpo import GRPOConfig
from workers.algo.nft import nft_loss, noisy_sample, optimality
from workers.algo.sampler import SamplerConfig
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig


def test_at_the_sampling_policy_the_gradient_is_advantage_weighted_flow_matching():
    v = torch.randn(4, 3, 8, 8, requires_grad=True)
    v_old, target = v.detach().clone(), torch.randn(4, 3, 8, 8)
    r = torch.tensor([1.0, 0.0, 0.5, 0.75])
    loss, _ = nft_loss(v, v_old, target, r, beta=1.0)
    loss.backward()
    # d/dv of r|v-u|^2 + (1-r)|2v_old-v-u|^2 at v = v_old, averaged over 3*64 dims and 4 samples
    expected = 2 * (2 * r - 1).view(4, 1, 1, 1) * (v_old - target) / (3 * 64) / 4
    assert torch.allclose(v.grad, expected, atol=1e-6)
    assert v.grad[2].abs().max() == 0  # r = 0.5 (a tied group): no push at all


def test_a_tied_group_only_pulls_the_policy_back_to_the_sampling_policy():
    v_old, target = torch.zeros(2, 3, 4, 4), torch.randn(2, 3, 4, 4)
    v = (v_old + 0.3).requires_grad_(True)
    loss, stats = nft_loss(v, v_old, target, torch.full((2,), 0.5), beta=1.0)
    loss.backward()
    assert stats["drift"] > 0
    assert (v.grad > 0).all()  # descent moves v back towards v_old = 0


def test_optimality_maps_advantages_into_zero_one():
    r = optimality(torch.tensor([-10.0, -1.0, 0.0, 1.0, 10.0]), scale=2.0)
    assert r.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ValueError, match="scale"):
        optimality(torch.zeros(1), scale=0.0)


def test_noisy_sample_interpolates_between_image_and_noise():
    x0, eps = torch.ones(2, 3, 2, 2), -torch.ones(2, 3, 2, 2)
    x, target = noisy_sample(x0, torch.tensor([0.0, 1.0]), eps)
    assert torch.equal(x[0], x0[0]) and torch.equal(x[1], eps[1])
    assert torch.equal(target, eps - x0)


def _nft_config(**grpo):
    return TrainConfig(
        prompts_per_iteration=2,
        group_size=4,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=4, noise_level=0.0),
        grpo=GRPOConfig(objective="nft", num_minibatches=1, **grpo),
    )


def _weighted_fm_loss(policy, batch, gen_seed=0) -> float:
    """Advantage-weighted flow-matching loss of the batch's images (lower = good samples likelier)."""
    gen = torch.Generator().manual_seed(gen_seed)
    x0 = batch.trajectory.images
    total = 0.0
    with torch.no_grad():
        emb, mask = policy.encode_prompts(batch.trajectory.prompts)
        for _ in range(8):
            sigma = torch.rand(x0.shape[0], generator=gen)
            x, target = noisy_sample(x0, sigma, torch.randn(x0.shape, generator=gen))
            per = ((policy.velocity(x, sigma, emb, mask) - target) ** 2).mean(dim=(1, 2, 3))
            total += float((batch.advantages * per).sum())
    return total


def test_an_nft_update_on_ode_rollouts_makes_better_samples_likelier(tiny_policy):
    trainer = GRPOTrainer(tiny_policy, _nft_config(lr=1e-3, nft_timesteps=4))
    batch = trainer.collect(0)
    assert torch.isnan(batch.trajectory.log_probs).all()  # ODE rollout: no log-probs needed
    before = _weighted_fm_loss(tiny_policy, batch)
    stats = trainer.update(batch)
    assert stats["fm_loss"] > 0 and stats["optimizer_steps"] == 1
    assert _weighted_fm_loss(tiny_policy, batch) < before


def test_the_sampling_policy_is_the_snapshot_taken_at_collection(tiny_policy):
    trainer = GRPOTrainer(tiny_policy, _nft_config(lr=1e-3))
    batch = trainer.collect(0)
    snapshot = {k: v.clone() for k, v in trainer.sampling_policy.state_dict().items()}
    trainer.update(batch)
    assert all(torch.equal(snapshot[k], v) for k, v in trainer.sampling_policy.state_dict().items())
    changed = [k for k, v in tiny_policy.state_dict().items() if not torch.equal(snapshot[k], v)]
    assert changed  # the policy moved, its sampling snapshot did not
    trainer.collect(1)
    assert all(torch.equal(tiny_policy.state_dict()[k], v) for k, v in trainer.sampling_policy.state_dict().items())


def test_flow_grpo_on_the_ode_is_refused_with_a_pointer_to_nft():
    with pytest.raises(ValueError, match="nft"):
        TrainConfig(sampler=SamplerConfig(noise_level=0.0), grpo=GRPOConfig(objective="flow_grpo"))


def test_a_kl_weight_with_nft_pulls_the_policy_back_towards_the_reference(tiny_policy):
    import copy

    base = copy.deepcopy(tiny_policy)
    drifts = []
    for kl_beta in (0.0, 50.0):
        policy = copy.deepcopy(base)
        trainer = GRPOTrainer(policy, _nft_config(lr=3e-3, kl_beta=kl_beta))
        stats = {}
        for it in range(3):
            stats = trainer.update(trainer.collect(it))
        assert (stats["kl"] > 0) == (kl_beta > 0)
        drifts.append(
            sum(
                float(((p.detach() - q.detach()) ** 2).sum())
                for p, q in zip(policy.parameters(), base.parameters(), strict=False)
            )
        )
    assert drifts[1] < drifts[0]  # the anchored run ends closer to the base


def test_adaptive_weighting_scores_the_implied_clean_image_scale_free():
    v_old, target = torch.zeros(2, 3, 4, 4), torch.ones(2, 3, 4, 4)
    sigma = torch.tensor([0.5, 1.0])
    loss, _ = nft_loss(v_old.clone(), v_old, target, torch.ones(2), beta=1.0, sigma_N=sigma, weighting="adaptive")
    # x0 error sigma * (target - v) = sigma: squared over its own magnitude = sigma; mean of 0.5 and 1.0
    assert loss.item() == pytest.approx(0.75)
    big, _ = nft_loss(v_old.clone(), v_old, 10 * target, torch.ones(2), beta=1.0, sigma_N=sigma, weighting="adaptive")
    assert big.item() == pytest.approx(7.5)  # linear, not quadratic, in the error's scale
    with pytest.raises(ValueError, match="sigma_N"):
        nft_loss(v_old, v_old, target, torch.ones(2), beta=1.0, weighting="adaptive")


def test_an_adaptive_nft_update_makes_better_samples_likelier(tiny_policy):
    trainer = GRPOTrainer(tiny_policy, _nft_config(lr=1e-3, nft_timesteps=4, nft_weighting="adaptive"))
    batch = trainer.collect(0)
    before = _weighted_fm_loss(tiny_policy, batch)
    trainer.update(batch)
    assert _weighted_fm_loss(tiny_policy, batch) < before


@pytest.mark.parametrize(
    "field,value",
    [("objective", "ppo"), ("nft_beta", 0.0), ("nft_timesteps", 0), ("nft_adv_scale", -1.0), ("nft_weighting", "x0")],
)
def test_bad_nft_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        GRPOConfig(**{field: value})


def test_the_learning_rate_warms_up_and_a_restored_optimizer_continues_the_ramp(tiny_policy):
    trainer = GRPOTrainer(tiny_policy, _nft_config(lr=1e-3, lr_warmup_steps=4))
    assert [trainer.update(trainer.collect(it))["learning_rate"] for it in range(2)] == pytest.approx([2.5e-4, 5e-4])
    resumed = GRPOTrainer(tiny_policy, _nft_config(lr=1e-3, lr_warmup_steps=4))
    resumed.optimizer.load_state_dict(trainer.optimizer.state_dict())  # what a resumed run restores
    assert [resumed.update(resumed.collect(it))["learning_rate"] for it in (2, 3, 4)] == pytest.approx(
        [7.5e-4, 1e-3, 1e-3]
    )


def test_a_cosine_schedule_decays_after_the_warm_up_to_near_zero_at_the_last_step(tiny_policy):
    config = dataclasses.replace(_nft_config(lr=1e-3, lr_warmup_steps=2, lr_schedule="cosine"), iterations=6)
    trainer = GRPOTrainer(tiny_policy, config)
    rates = [trainer.update(trainer.collect(it))["learning_rate"] for it in range(2)]
    resumed = GRPOTrainer(tiny_policy, config)
    resumed.optimizer.load_state_dict(trainer.optimizer.state_dict())  # a resumed run keeps its place
    rates += [resumed.update(resumed.collect(it))["learning_rate"] for it in range(2, 6)]
    # steps 0-1 ramp; steps 2..5 follow 0.5 (1 + cos(pi k / 4)), k = 0..3
    assert rates == pytest.approx([5e-4, 1e-3, 1e-3, 8.536e-4, 5e-4, 1.464e-4], rel=1e-3)


def test_an_unknown_lr_schedule_is_refused():
    with pytest.raises(ValueError, match="lr_schedule"):
        GRPOConfig(lr_schedule="linear")


@pytest.mark.parametrize("bad", [(0.5, 0.5), (-0.1, 1.0), (0.3, 1.2), (0.9, 0.2)])
def test_a_noise_level_range_outside_zero_one_or_empty_is_refused(bad):
    with pytest.raises(ValueError, match="nft_sigma_range"):
        GRPOConfig(nft_sigma_range=bad)


def test_antithetic_noise_levels_come_in_pairs_of_one_sigma_and_opposite_noise():
    from workers.algo.nft import noise_levels

    draws = list(noise_levels((4, 3, 8, 8), 4, (0.2, 0.8), True, torch.Generator().manual_seed(0)))
    assert len(draws) == 4
    for (s0, e0), (s1, e1) in (draws[0:2], draws[2:4]):
        assert torch.equal(s0, s1) and torch.equal(e1, -e0)
    assert not torch.equal(draws[0][0], draws[2][0])
    assert all(((0.2 <= s) & (s <= 0.8)).all() for s, _ in draws)
    plain = list(noise_levels((4, 3, 8, 8), 2, (0.2, 0.8), False, torch.Generator().manual_seed(0)))
    assert not torch.equal(plain[1][1], -plain[0][1])
