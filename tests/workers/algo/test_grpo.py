import pytest
import torch

from workers.algo.grpo import GRPOConfig, clipped_policy_loss, group_advantages, group_reward_stats, kl_to_reference


def test_advantages_are_zero_mean_and_unit_std_per_group():
    rewards = torch.tensor([0.1, 0.5, 0.9, 0.3, 2.0, 4.0, 6.0, 8.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    adv = group_advantages(rewards, groups)
    for g in (0, 1):
        a = adv[groups == g].double()
        assert abs(float(a.mean())) < 1e-6
        assert abs(float(a.std(unbiased=False)) - 1.0) < 1e-3


def test_a_group_with_equal_rewards_gets_zero_advantage():
    adv = group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 1, 1]))
    assert torch.equal(adv[:3], torch.zeros(3))
    stats = group_reward_stats(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]))
    assert stats["zero_std_ratio"] == 0.5


def test_batch_normalised_advantages_keep_a_near_tie_small_and_a_clear_split_large():
    rewards = torch.tensor([0.80, 0.80, 0.80, 0.75, 1.0, 0.3, 1.0, 0.3])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    per_group, batch = group_advantages(rewards, groups), group_advantages(rewards, groups, norm="batch")
    assert float(per_group[3]) < -1.5  # the group's own std turns a 0.05 gap into a big advantage
    assert abs(float(batch[3])) < 0.2 and float(batch[4]) > 1.0  # one std for all: the gap stays small
    for g in (0, 1):
        assert abs(float(batch[groups == g].double().mean())) < 1e-6
    assert abs(float(batch.double().pow(2).mean().sqrt()) - 1.0) < 1e-3
    with pytest.raises(ValueError, match="adv_norm"):
        GRPOConfig(adv_norm="global")


def test_advantages_are_clipped():
    rewards = torch.tensor([0.0] * 99 + [1.0])
    adv = group_advantages(rewards, torch.zeros(100, dtype=torch.long), clip=5.0)
    assert float(adv.max()) == 5.0


def test_loss_pushes_up_the_log_prob_of_positive_advantage_samples():
    lp = torch.zeros(2, requires_grad=True)
    loss, _ = clipped_policy_loss(lp, torch.zeros(2), torch.tensor([1.0, -1.0]), clip_range=1e-4)
    loss.backward()
    assert lp.grad[0] < 0 < lp.grad[1]  # gradient descent raises sample 0, lowers sample 1


def test_clipped_ratio_stops_the_gradient():
    lp = torch.tensor([0.01], requires_grad=True)  # ratio e^0.01 is far outside 1 +- 1e-4
    loss, stats = clipped_policy_loss(lp, torch.zeros(1), torch.tensor([1.0]), clip_range=1e-4)
    loss.backward()
    assert float(lp.grad) == 0.0 and stats["clip_frac"] == 1.0


def test_kl_to_an_identical_reference_is_zero_and_grows_with_distance():
    mean = torch.randn(3, 3, 4, 4)
    std, dt = torch.tensor(0.5), torch.tensor(-0.125)
    assert torch.equal(kl_to_reference(mean, mean, std, dt), torch.zeros(3))
    assert bool((kl_to_reference(mean + 0.2, mean, std, dt) > kl_to_reference(mean + 0.1, mean, std, dt)).all())


@pytest.mark.parametrize(
    "field,value", [("lr", -1e-5), ("lr", 0.0), ("clip_range", 0.0), ("kl_beta", -0.1), ("num_minibatches", 0)]
)
def test_bad_grpo_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        GRPOConfig(**{field: value})


def test_the_gpu_presets_kl_term_weighs_what_flow_grpos_beta_weighed():
    """flow_grpo's train_sd3.py: beta * mean((mu - mu_ref)^2) / (2 std_dev_t^2) with beta 0.04 (GenEval, OCR). The
    presets citing it put the same number in the loss; the step's own KL is that divided by |dt|."""
    from workers.trainer.presets import get_preset

    gen = torch.Generator().manual_seed(0)
    mean, ref = torch.randn(3, 4, 8, 8, generator=gen), torch.randn(3, 4, 8, 8, generator=gen)
    std, dt = torch.tensor(0.9), torch.tensor(-0.08)
    flow_grpo = 0.04 * ((mean - ref) ** 2).mean(dim=(1, 2, 3)) / (2 * std**2)
    for name in ("sd35m_lora", "sd35m_geneval", "sd35m_ocr"):
        g = get_preset(name).grpo
        torch.testing.assert_close(g.kl_beta * kl_to_reference(mean, ref, std, dt, g.kl_form), flow_grpo)
    for name in ("qwen_image_lora", "flux1_lora"):  # pickscore_qwenimage, pickscore_flux: train.beta 0
        assert get_preset(name).grpo.kl_beta == 0
    torch.testing.assert_close(
        kl_to_reference(mean, ref, std, dt, "step"), kl_to_reference(mean, ref, std, dt, "flow_grpo") / 0.08
    )
    with pytest.raises(ValueError, match="kl_form"):
        GRPOConfig(kl_form="nope")
