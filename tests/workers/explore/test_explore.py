"""Seed exploration: cheap deterministic scoring of candidate seeds, max-variance groups, rank agreement,
the monitor."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from workers.algo.rank_consistency import kendall_tau_b, mean_over_groups, pairwise_concordance, spearman_rho
from workers.algo.sampler import SamplerConfig, rollout
from workers.algo.seeds import candidate_seeds
from workers.algo.selection import select_max_variance
from workers.explore.request import CACHE_LEVELS, ExploreSpec, cache_level, explore_rewards
from workers.explore.seed_plan import (
    SeedPlan,
    default_seed_plan,
    load_seed_plan,
    plan_from_exploration,
    publish_seed_plan,
)
from workers.explore.state import ExplorationState, ExploreConfig, review_rollout

SAMPLER = SamplerConfig(num_steps=4, noise_level=0.0)


@pytest.fixture
def two_block_policy():
    """tiny_policy with a second block: FirstBlockCache needs one to skip."""
    from workers.model.tiny_policy import PolicyConfig, build_policy

    config = PolicyConfig(image_size=16, num_layers=2, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
    return build_policy(config, seed=0).eval()


def test_the_max_variance_group_beats_every_other_group_of_that_size() -> None:
    rewards = [0.3, 0.9, 0.1, 0.5, 0.5, 1.0, 0.0, 0.7]
    seeds = list(range(100, 108))
    picked = select_max_variance(seeds, rewards, 4)
    best = max(np.var([rewards[i] for i in c]) for c in itertools.combinations(range(8), 4))
    assert np.var([rewards[seeds.index(s)] for s in picked]) == pytest.approx(best)
    assert picked == [101, 102, 105, 106]  # the two lowest and the two highest, in candidate order


def test_the_choice_among_equal_rewards_is_deterministic_and_balanced() -> None:
    rewards = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert select_max_variance(list(range(8)), rewards, 4) == [0, 1, 2, 4]
    assert select_max_variance(list(range(8)), [0.5] * 8, 3) == [0, 1, 2]


def test_candidates_start_with_the_default_request_seeds_and_are_distinct() -> None:
    from workers.algo.seeds import request_seed

    seeds = candidate_seeds(7, 3, 2, 4, 12)
    assert seeds[:4] == [request_seed(7, 3, 2, j) for j in range(4)]
    assert len(set(seeds)) == 12 and seeds == candidate_seeds(7, 3, 2, 4, 12)
    with pytest.raises(ValueError, match="num_candidates"):
        candidate_seeds(7, 3, 2, 4, 3)


def test_rank_agreement_measures_on_known_orders_and_ties() -> None:
    assert kendall_tau_b([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert kendall_tau_b([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert spearman_rho([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert kendall_tau_b([0, 0, 1, 1], [0, 1, 0, 1]) == 0.0
    assert kendall_tau_b([0, 0, 1], [0.2, 0.1, 0.9]) == pytest.approx(2 / math.sqrt(2 * 3))  # tau-b with a tie
    assert pairwise_concordance([0, 0, 1], [0.2, 0.1, 0.9]) == 1.0
    assert math.isnan(kendall_tau_b([0.5, 0.5, 0.5], [1, 2, 3])) and math.isnan(spearman_rho([1, 1], [2, 3]))
    assert mean_over_groups(kendall_tau_b, [[1, 1], [1, 2]], [[3, 4], [5, 6]]) == 1.0  # the constant group is skipped


@pytest.mark.parametrize("level", sorted(CACHE_LEVELS))
def test_an_exploration_request_is_deterministic_and_leaves_no_cache_hook_behind(two_block_policy, level: str) -> None:
    import torch

    policy = two_block_policy
    spec = ExploreSpec("demo", "two red circles", tuple(candidate_seeds(0, 1, 0, 2, 5)), 0, SAMPLER, level)
    before = rollout(policy, ["a blue square"] * 2, [1, 2], SAMPLER).images
    first = explore_rewards(policy, spec)
    assert len(first) == 5 and explore_rewards(policy, spec) == first
    assert not policy.transformer.is_cache_enabled
    assert torch.equal(rollout(policy, ["a blue square"] * 2, [1, 2], SAMPLER).images, before)


def test_first_block_cache_on_a_one_block_model_is_refused_clearly(tiny_policy) -> None:
    spec = ExploreSpec("demo", "two red circles", (1, 2), 0, SAMPLER, "fbcache")
    with pytest.raises(ValueError, match="at least 2 blocks"):
        explore_rewards(tiny_policy, spec)
    assert not tiny_policy.transformer.is_cache_enabled


def test_cheap_levels_sample_fewer_steps_and_scale_the_sde_window() -> None:
    rollout_sampler = SamplerConfig(num_steps=8, noise_level=0.7, sde_window=(0, 4))
    assert cache_level("half_steps").sampler(rollout_sampler) == SamplerConfig(
        num_steps=4, noise_level=0.7, sde_window=(0, 2)
    )
    assert cache_level("quarter_steps").sampler(rollout_sampler).num_steps == 2
    assert cache_level("fbcache").sampler(rollout_sampler) == rollout_sampler


@pytest.mark.parametrize(
    "change,message",
    [
        ({"cache_level": "turbo"}, "unknown cache level"),
        ({"seeds": [3, 3]}, "distinct"),
        ({"prompt": "  "}, "prompt must be non-empty text"),
        ({"colour": "red"}, "unknown fields"),
        ({"seeds": [-1, 2]}, "seeds must be ints"),
    ],
)
def test_a_malformed_exploration_payload_is_refused_before_any_compute(change: dict, message: str) -> None:
    payload = ExploreSpec("demo", "two red circles", (1, 2, 3), 0, SAMPLER).to_payload()
    with pytest.raises(ValueError, match=message):
        ExploreSpec.from_payload({**payload, **change})


def test_a_payload_roundtrip_keeps_the_request_and_its_fingerprint() -> None:
    spec = ExploreSpec(
        "demo", "two red circles", (1, 2, 3), 4, SamplerConfig(num_steps=8, sde_window=(0, 4)), "fbcache"
    )
    again = ExploreSpec.from_payload(spec.to_payload())
    assert again == spec and again.fingerprint == spec.fingerprint


def test_a_seed_plan_from_the_same_exploration_reproduces_exactly(tmp_store) -> None:
    from workers.model.tiny_policy import load_policy
    from workers.trainer.presets import get_preset

    config = get_preset("cpu_smoke")
    plans = []
    for _ in range(2):  # two fresh policies: nothing carries over but the weights
        policy, explored = load_policy(), {}
        for i, prompt in enumerate(default_seed_plan(config, 3).prompts):
            seeds = candidate_seeds(config.seed, 3, i, config.group_size, 3 * config.group_size)
            explored[i] = (
                seeds,
                explore_rewards(policy, ExploreSpec("demo", prompt, tuple(seeds), 2, config.sampler, "half_steps")),
            )
        plans.append(plan_from_exploration(config, 3, explored, "explore:m12-half_steps"))
    assert plans[0] == plans[1] and len(set(plans[0].explored_rewards[0])) > 1
    publish_seed_plan(tmp_store, "demo", plans[0])
    assert load_seed_plan(tmp_store, "demo", 3) == plans[0]
    assert plans[0].flat_seeds() != default_seed_plan(config, 3).flat_seeds()


def _plan(explored_rewards, planner="explore:m8-half_steps") -> SeedPlan:
    return SeedPlan(1, planner, ["a", "b"], [[1, 2, 3, 4], [5, 6, 7, 8]], explored_rewards)


def test_the_monitor_measures_gain_against_random_seeds_and_counts_an_iteration_once() -> None:
    config = ExploreConfig(seed_multipliers=(2,), cache_levels=("half_steps",))
    state = ExplorationState.new(config, group_size=4)
    random_plan = SeedPlan(0, "default", ["a", "b"], [[1, 2, 3, 4], [5, 6, 7, 8]])
    review_rollout(state, config, 0, random_plan, [[0.5, 0.5, 0.6, 0.4], [0.5, 0.6, 0.5, 0.4]])
    baseline = state.random_variance
    real = [[0.0, 0.1, 0.9, 1.0], [0.2, 0.1, 0.8, 0.9]]
    review = review_rollout(state, config, 1, _plan([[0.0, 0.2, 0.8, 1.0], [0.1, 0.0, 0.8, 0.9]]), real)
    assert review.kendall_tau == pytest.approx(1.0) and review.variance_gain == pytest.approx(
        min(np.mean([np.var(r) for r in real]) / baseline, config.bandit.gain_cap)
    )
    assert not review.fallback and state.bandit.stats["m8-half_steps"].pulls == 1
    review_rollout(state, config, 1, _plan([[0.0, 0.2, 0.8, 1.0], [0.1, 0.0, 0.8, 0.9]]), real)  # a redone iteration
    assert state.bandit.stats["m8-half_steps"].pulls == 1 and state.random_variance == baseline


def test_rankings_that_stop_agreeing_make_the_next_plan_fall_back_to_random_seeds_until_they_agree_again() -> None:
    config = ExploreConfig(seed_multipliers=(2,), cache_levels=("half_steps",), min_kendall_tau=0.2)
    state = ExplorationState.new(config, group_size=4)
    real = [[0.0, 0.1, 0.9, 1.0], [0.2, 0.1, 0.8, 0.9]]
    reversed_ = [[1.0, 0.9, 0.1, 0.0], [0.9, 0.8, 0.1, 0.2]]
    assert review_rollout(state, config, 1, _plan(reversed_), real).fallback and state.fallback
    fallback_plan = _plan(real, planner="random:fallback-tau--1.00")  # default seeds, still explored
    assert not review_rollout(state, config, 2, fallback_plan, real).fallback and not state.fallback


def test_exploration_state_survives_a_json_roundtrip() -> None:
    import json

    config = ExploreConfig()
    state = ExplorationState.new(config, group_size=8)
    state.record_train_s(0, 12.5)
    state.record_time(0, config.arms(8)[0], 30.0, 8)
    again = ExplorationState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again.to_dict() == state.to_dict() and again.budget_s() == 12.5


@pytest.mark.parametrize(
    "change,message",
    [
        ({"cache_levels": ("warp",)}, "unknown cache level"),
        ({"seed_multipliers": (0,)}, "seed_multipliers"),
        ({"min_kendall_tau": 2.0}, "min_kendall_tau"),
        ({"num_workers": 0}, "num_workers"),
    ],
)
def test_bad_exploration_settings_are_refused_with_the_field_named(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ExploreConfig(**change)
