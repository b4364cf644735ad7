import itertools

import pytest
import torch

from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig, step_log_prob
from workers.algo.seeds import request_seed
from workers.task.prompts import iteration_prompts
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig


def _config(**grpo):
    return TrainConfig(
        prompts_per_iteration=2,
        group_size=4,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=4),
        grpo=GRPOConfig(**grpo),
    )


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
    assert all(torch.equal(a, b) for a, b in zip(ref_before, trainer.reference.parameters(), strict=False))


def test_prompts_and_seeds_are_a_pure_function_of_run_seed_and_iteration():
    """The same in another process (another hash seed) and whatever the global RNGs hold: a resumed run or a
    worker on another machine draws what the first process drew."""
    import json
    import random
    import subprocess
    import sys

    import numpy as np

    from tests.paths import REPO_ROOT

    code = (
        "import json; from workers.task.prompts import iteration_prompts; from workers.algo.seeds import request_seed; "
        "print(json.dumps([iteration_prompts(0, 3, 8), iteration_prompts(0, 4, 8), request_seed(0, 1, 2, 3), "
        "request_seed(0, 1, 2, 4), request_seed(1, 1, 2, 3)]))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO_ROOT)},
        check=True,
    )
    saved = random.getstate(), np.random.get_state()
    with torch.random.fork_rng():
        random.seed(7)  # the draws must not read the global generators
        np.random.seed(7)
        torch.manual_seed(7)
        here = [
            iteration_prompts(0, 3, 8),
            iteration_prompts(0, 4, 8),
            request_seed(0, 1, 2, 3),
            request_seed(0, 1, 2, 4),
            request_seed(1, 1, 2, 3),
        ]
    random.setstate(saved[0])
    np.random.set_state(saved[1])
    assert json.loads(other.stdout) == here
    assert here[0] != here[1] and len({here[2], here[3], here[4]}) == 3  # iteration, sample and run seed all count


def test_config_refuses_more_minibatches_than_samples():
    with pytest.raises(ValueError, match="num_minibatches"):
        TrainConfig(prompts_per_iteration=1, group_size=2, grpo=GRPOConfig(num_minibatches=4))


def test_train_categories_restrict_the_prompt_schedule():
    from workers.task.prompts import parse_prompt

    prompts = [p for it in range(6) for p in iteration_prompts(0, it, 8, ("counting", "position"))]
    assert {parse_prompt(p).category for p in prompts} == {"counting", "position"}


def test_an_unknown_train_category_is_refused_before_compute():
    with pytest.raises(ValueError, match="train_categories"):
        TrainConfig(train_categories=("counting", "colour_binding"))


def test_a_wider_draw_keeps_the_group_of_largest_reward_variance(tiny_policy):
    wide = GRPOTrainer(tiny_policy, TrainConfig(**{**_config().__dict__, "rollouts_per_prompt": 8}))
    plain = GRPOTrainer(tiny_policy, _config())
    batch, default = wide.collect(0), plain.collect(0)
    assert batch.rewards.shape == (8,) and batch.trajectory.images.shape[0] == 8
    assert batch.drawn_rewards.shape == (16,)
    drawn = batch.drawn_rewards.view(2, 8)
    for i in range(2):
        kept = batch.rewards[i * 4 : (i + 1) * 4]
        # the draw starts with the default seeds, so the kept group has at least their contrast
        assert kept.var(unbiased=False) >= default.rewards[i * 4 : (i + 1) * 4].var(unbiased=False)
        assert kept.max() == drawn[i].max() and kept.min() == drawn[i].min()
    # the kept rows are the images of the kept seeds: replaying a seed reproduces its reward
    replay = plain.collect(0, seeds=batch.trajectory.seeds)
    assert torch.equal(replay.rewards, batch.rewards)
    assert wide.batch_stats(batch)["reward_mean"] == pytest.approx(float(batch.drawn_rewards.mean()))


def test_a_seed_plan_is_used_as_given_even_with_a_wider_draw(tiny_policy):
    trainer = GRPOTrainer(tiny_policy, TrainConfig(**{**_config().__dict__, "rollouts_per_prompt": 8}))
    seeds = [11, 12, 13, 14, 21, 22, 23, 24]
    batch = trainer.collect(0, seeds=seeds)
    assert batch.trajectory.seeds == seeds and batch.drawn_rewards is None
    with pytest.raises(ValueError, match="seeds for 2 prompts"):
        trainer.collect(0, seeds=seeds[:5])


def test_a_draw_smaller_than_the_group_is_refused_before_compute():
    with pytest.raises(ValueError, match="rollouts_per_prompt=3 must be >= group_size=4"):
        TrainConfig(prompts_per_iteration=2, group_size=4, rollouts_per_prompt=3)


def test_keeping_the_largest_variance_leaves_small_groups_whole_and_recomputes_advantages():
    from workers.algo.grpo import GRPOConfig
    from workers.algo.sampler import Trajectory
    from workers.trainer.grpo_trainer import Rollouts, keep_max_variance

    # prompt 0 drew 6 samples (a wide default plan), prompt 1 exactly 4 (seeds exploration chose)
    rewards = torch.tensor([0.5, 0.9, 0.1, 0.55, 0.6, 0.45, 0.2, 0.4, 0.6, 0.8])
    group_ids = torch.tensor([0] * 6 + [1] * 4)
    n = len(rewards)
    traj = Trajectory(
        [f"p{g}" for g in group_ids.tolist()],
        list(range(100, 100 + n)),
        torch.arange(n, dtype=torch.float32).view(1, n, 1, 1, 1).expand(2, n, 3, 2, 2).clone(),
        torch.zeros(1, n),
        1,
    )
    grpo = GRPOConfig()
    batch = Rollouts(0, traj, rewards, group_ids, grpo.advantages(rewards, group_ids), 1.0)
    kept = keep_max_variance(batch, 4, grpo)
    best = max(itertools.combinations(range(6), 4), key=lambda c: float(rewards[list(c)].var(unbiased=False)))
    assert best == (1, 2, 4, 5)  # 0.1, 0.45 low and 0.9, 0.6 high: not simply the four highest
    assert kept.trajectory.seeds == [101, 102, 104, 105, 106, 107, 108, 109]
    assert torch.equal(kept.trajectory.images[:, 0, 0, 0], torch.tensor([1.0, 2, 4, 5, 6, 7, 8, 9]))
    assert torch.equal(kept.drawn_rewards, rewards)
    assert torch.allclose(kept.advantages[4:], batch.advantages[6:])  # the small group is untouched
    assert abs(float(kept.advantages[:4].sum())) < 1e-5  # zero-mean over the kept four
    assert keep_max_variance(kept, 4, grpo) is kept  # nothing wider than the group: the batch itself
