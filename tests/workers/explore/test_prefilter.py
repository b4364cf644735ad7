"""Exploration as a pre-filter (W > G seeds kept for the rollout), control prompts, uncontested prompts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from workers.algo.seeds import candidate_seeds
from workers.algo.selection import select_max_variance
from workers.explore.seed_plan import SeedPlan, default_seed_plan, plan_from_exploration
from workers.explore.state import ExplorationState, ExploreConfig, review_rollout
from workers.trainer.presets import get_preset

CONFIG = dataclasses.replace(get_preset("cpu_smoke"), prompts_per_iteration=3)  # G = 4
G, M = 4, 12


def _explored(rows: list[list[float]]) -> dict[int, tuple[list[int], list[float]]]:
    return {i: (candidate_seeds(CONFIG.seed, 5, i, G, M), r) for i, r in enumerate(rows)}


def test_default_arms_keep_their_names_and_keep_factors_add_pre_filter_arms() -> None:
    assert [a.name for a in ExploreConfig(seed_multipliers=(2,), cache_levels=("half_steps",)).arms(8)] == [
        "m16-half_steps"
    ]
    arms = [
        a.name
        for a in ExploreConfig(seed_multipliers=(1, 4), cache_levels=("half_steps",), keep_factors=(1.0, 1.5)).arms(8)
    ]
    assert arms == ["m8-half_steps", "m32-half_steps", "m32-half_steps-w12"]  # W = 12 > M = 8 is no arm


def test_a_pre_filter_plan_keeps_the_w_seeds_of_largest_stale_variance_and_only_g_where_nothing_is_contested() -> None:
    rng = np.random.default_rng(0)
    contested = rng.uniform(size=M).round(2).tolist()
    flat = [0.5] * M  # every candidate scored alike: nothing to choose between
    explored = _explored([contested, flat, contested])
    plan = plan_from_exploration(CONFIG, 5, explored, "explore:m12-half_steps-w6", keep=6)
    seeds0 = explored[0][0]
    assert plan.seeds[0] == select_max_variance(seeds0, contested, 6) and len(plan.seeds[0]) == 6
    assert plan.seeds[1] == default_seed_plan(CONFIG, 5).seeds[1]  # the G default seeds, no extra rollout
    assert plan.explored_rewards[0] == [contested[seeds0.index(s)] for s in plan.seeds[0]]
    plan.check_matches(CONFIG)  # the rollout accepts a plan wider than G; the train phase keeps G
    # Nearly equal stale rewards count as uncontested once min_contest_std says so.
    nearly = [0.5 + 0.001 * (j % 2) for j in range(M)]
    assert (
        plan_from_exploration(
            CONFIG, 5, _explored([nearly, flat, flat]), "explore:m12-half_steps-w6", keep=6, min_contest_std=0.01
        ).seeds[0]
        == default_seed_plan(CONFIG, 5).seeds[0]
    )


def test_a_default_plan_of_the_wrong_width_is_still_refused() -> None:
    plan = default_seed_plan(CONFIG, 5)
    wide = SeedPlan(5, "default", plan.prompts, [g + [g[0] + 1] for g in plan.seeds])
    with pytest.raises(ValueError, match="does not match"):
        wide.check_matches(CONFIG)


def test_control_prompts_keep_random_seeds_rotate_and_refresh_the_random_baseline() -> None:
    config = ExploreConfig(seed_multipliers=(3,), cache_levels=("half_steps",), control_prompts=1)
    assert [config.controls(k, 3) for k in range(4)] == [[0], [1], [2], [0]]
    rng = np.random.default_rng(1)
    explored = _explored([rng.uniform(size=M).tolist() for _ in range(3)])
    plan = plan_from_exploration(CONFIG, 5, explored, "explore:m12-half_steps", controls=(1,))
    assert plan.seeds[1] == default_seed_plan(CONFIG, 5).seeds[1] and plan.control_prompts == (1,)
    assert plan.seeds[0] != default_seed_plan(CONFIG, 5).seeds[0]
    # The monitor: the control group alone sets the random baseline; the explored groups give the gain.
    state = ExplorationState.new(config, group_size=G)
    state.random_variance = 100.0  # a stale baseline, e.g. iteration 0's draw
    real = [[0.0, 1.0, 0.0, 1.0], [0.4, 0.6, 0.4, 0.6], [0.0, 1.0, 1.0, 0.0]]
    review = review_rollout(state, config, 5, plan, real, group_size=G)
    assert review.explored_prompts == [True, False, True]
    assert state.random_variance == pytest.approx(0.5 * 100.0 + 0.5 * np.var(real[1]))
    assert review.variance_gain == pytest.approx(np.mean([np.var(r) for r in real]) / state.random_variance)
    assert state.bandit.stats["m12-half_steps"].tau_count == 1  # the arm's fidelity, measured online


def test_a_pre_filter_review_judges_the_g_the_train_phase_keeps() -> None:
    config = ExploreConfig(seed_multipliers=(3,), cache_levels=("half_steps",), keep_factors=(1.5,))
    state = ExplorationState.new(config, group_size=G)
    state.random_variance = 0.05
    plan = SeedPlan(5, "explore:m12-half_steps-w6", ["a"], [[1, 2, 3, 4, 5, 6]], [[0.0, 0.1, 0.2, 0.8, 0.9, 1.0]])
    real = [[0.0, 0.5, 0.5, 0.5, 0.5, 1.0]]
    review = review_rollout(state, config, 5, plan, real, group_size=G)
    assert review.trained_variance == [pytest.approx(np.var([0.0, 0.5, 0.5, 1.0]))]  # the kept 4 of the 6 drawn
    assert state.bandit.stats["m12-half_steps-w6"].pulls == 1


@pytest.mark.parametrize(
    "change,message",
    [
        ({"keep_factors": (0.5,)}, "keep_factors"),
        ({"keep_factors": ()}, "keep_factors"),
        ({"control_prompts": -1}, "control_prompts"),
        ({"min_contest_std": -0.1}, "min_contest_std"),
    ],
)
def test_bad_pre_filter_settings_are_refused_with_the_field_named(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ExploreConfig(**change)


def test_a_pre_filter_plan_is_refused_by_a_config_whose_groups_it_cannot_fill() -> None:
    explored = _explored([np.linspace(0, 1, M).tolist()] * 3)
    plan = plan_from_exploration(CONFIG, 5, explored, "explore:m12-half_steps-w6", keep=6)
    plan.check_matches(CONFIG)
    with pytest.raises(ValueError, match="does not match"):
        plan.check_matches(dataclasses.replace(CONFIG, group_size=8))  # 6 seeds per prompt for groups of 8


def test_the_demo_and_hard_presets_explore_as_a_pre_filter_with_a_control_and_the_others_keep_the_defaults() -> None:
    from workers.explore.state import explore_config_for

    hard = get_preset("cpu_tiny_hard")
    assert hard.reward == "minigeneval_strict" and set(hard.train_categories) == {
        "counting",
        "position",
        "color_binding",
        "counting_binding",
    }
    config = explore_config_for("cpu_tiny_hard")
    assert [a.name for a in config.arms(hard.group_size)][:2] == ["m16-fbcache-w12", "m16-half_steps-w12"]
    assert config.control_prompts == 1 and config.bandit.min_arm_tau == 0.2
    assert explore_config_for("cpu_tiny_spot") == config  # the demo explores as the bench measured it
    assert explore_config_for("cpu_smoke") == ExploreConfig(budget_samples=16.0)  # 2 rollouts of 2 prompts x 4
    assert explore_config_for("sd35m_lora") == ExploreConfig()  # a GPU preset stops when training ends
    assert explore_config_for("cpu_tiny_spot").budget_samples == 128.0  # the demo: a request budget, not the clock
