"""The recipe features flow_grpo and DanceGRPO users rely on, each against the reference's own formula: global-std
advantages (flow_grpo/stat_tracking.py `PerPromptStatTracker.update`), the randomly placed SDE window (flow_grpo's
`pipeline_with_logprob`: `random.randint(lo, hi - size)`), the EMA (flow_grpo/ema.py `EMAModuleWrapper`) and one
initial noise per group (flow_grpo's `same_latent`, DanceGRPO's `--init_same_noise`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workers.algo.ema import EMAConfig, ema_decay, ema_update
from workers.algo.grpo import group_advantages
from workers.algo.sampler import SamplerConfig, rollout
from workers.algo.sde_window import check_sde_window_placement, place_sde_window


def _flow_grpo_advantages(prompts: list[str], rewards: np.ndarray, global_std: bool) -> np.ndarray:
    """flow_grpo/stat_tracking.py `PerPromptStatTracker.update` (type 'grpo'), as published, for one batch."""
    prompts_a = np.array(prompts)
    advantages = np.zeros_like(rewards)
    for prompt in np.unique(prompts_a):
        group = rewards[prompts_a == prompt]
        std = np.std(rewards) + 1e-4 if global_std else np.std(group) + 1e-4
        advantages[prompts_a == prompt] = (group - np.mean(group)) / std
    return advantages


def test_global_std_advantages_are_flow_grpos_global_std():
    rng = np.random.default_rng(0)
    rewards = np.concatenate([rng.normal(0, 1, 6), rng.normal(5, 0.01, 6), rng.normal(-2, 3, 6)])
    prompts = [p for p in "abc" for _ in range(6)]
    groups = torch.arange(3).repeat_interleave(6)
    ours = group_advantages(torch.tensor(rewards), groups, clip=1e9, norm="global_std")
    np.testing.assert_allclose(ours.numpy(), _flow_grpo_advantages(prompts, rewards, True), rtol=1e-6)
    per_group = group_advantages(torch.tensor(rewards), groups, clip=1e9, norm="group")
    np.testing.assert_allclose(per_group.numpy(), _flow_grpo_advantages(prompts, rewards, False), rtol=1e-6)
    # The near-constant group keeps a small advantage under the global std, +-1 under its own.
    assert ours[6:12].abs().max() < 0.05 < 0.9 < per_group[6:12].abs().max()
    assert group_advantages(torch.tensor(rewards), groups, clip=5.0, norm="global_std").abs().max() <= 5.0


def test_the_random_sde_window_is_flow_grpos_randint_placement_and_a_function_of_seed_and_iteration():
    size, window_range = 2, (0, 5)  # flow_grpo pickscore_qwenimage: sde_window_size 2, range (0, num_steps // 2)
    windows = [place_sde_window(size, window_range, 0, k) for k in range(400)]
    starts = [a for a, _ in windows]
    assert all(b - a == size for a, b in windows)
    assert set(starts) == {0, 1, 2, 3}  # randint(0, 5 - 2): both ends included, so the window ends by step 5
    assert max(np.bincount(starts)) < 0.35 * len(starts)  # about uniform, 1/4 each
    assert windows == [place_sde_window(size, window_range, 0, k) for k in range(400)]  # a replay places them again
    assert windows != [place_sde_window(size, window_range, 1, k) for k in range(400)]  # another run seed
    with pytest.raises(ValueError, match="fewer than sde_window_size"):
        check_sde_window_placement(3, (1, 3), 10)
    with pytest.raises(ValueError, match="num_steps=4"):
        check_sde_window_placement(2, (0, 5), 4)


class _FlowGrpoEMA:
    """flow_grpo/ema.py `EMAModuleWrapper.step`, as published, over a list of tensors."""

    def __init__(self, params, decay, update_step_interval):
        self.ema = [p.clone() for p in params]
        self.decay, self.interval = decay, update_step_interval

    def step(self, params, optimization_step):
        one_minus_decay = 1 - min((1 + optimization_step) / (10 + optimization_step), self.decay)
        if (optimization_step + 1) % self.interval == 0:
            for e, p in zip(self.ema, params, strict=True):
                e.add_(one_minus_decay * (p - e))


def test_the_ema_follows_flow_grpos_ema_module_wrapper_step_by_step():
    gen = torch.Generator().manual_seed(0)
    weights = {"a": torch.randn(4, 3, generator=gen), "b": torch.randn(5, generator=gen)}
    ours = {k: v.clone() for k, v in weights.items()}
    ref = _FlowGrpoEMA(list(weights.values()), decay=0.9, update_step_interval=8)
    config = EMAConfig(decay=0.9, every=8)
    updates = 0
    for step in range(1, 60):  # the trained weights walk; the EMA follows after each optimizer step
        for v in weights.values():
            v.add_(torch.randn(v.shape, generator=gen))
        updates += ema_update(ours, weights, step, config)
        ref.step(list(weights.values()), step)
    assert updates == 7  # steps 7, 15, ..., 55
    for mine, theirs in zip(ours.values(), ref.ema, strict=True):
        torch.testing.assert_close(mine, theirs)
    assert ema_decay(0, 0.9) == pytest.approx(0.1) and ema_decay(1000, 0.9) == 0.9
    assert not torch.equal(ours["a"], weights["a"])  # an average, not the weights
    with pytest.raises(ValueError, match="missing"):
        ema_update({"a": ours["a"]}, weights, 7, config)


def test_a_shared_initial_noise_starts_a_group_alike_and_its_sde_steps_apart(tiny_policy):
    prompts, seeds = ["a red circle"] * 3, [11, 12, 13]
    config = SamplerConfig(num_steps=4, noise_level=0.7)
    shared = rollout(tiny_policy, prompts, seeds, config, init_seeds=[99, 99, 99])
    own = rollout(tiny_policy, prompts, seeds, config)
    assert torch.equal(shared.latents[0][0], shared.latents[0][1]) and torch.equal(
        shared.latents[0][0], shared.latents[0][2]
    )
    assert not torch.equal(shared.latents[1][0], shared.latents[1][1])  # each sample's SDE noise is its own
    assert not torch.equal(own.latents[0][0], own.latents[0][1])
    again = rollout(tiny_policy, prompts, seeds, config, init_seeds=[99, 99, 99])
    assert torch.equal(again.latents, shared.latents)  # still a pure function of the request
    with pytest.raises(ValueError, match="initial seeds"):
        rollout(tiny_policy, prompts, seeds, config, init_seeds=[99])
