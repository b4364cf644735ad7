"""The monitor's baseline is what the run gets without exploration, also when a wider draw is on."""

from __future__ import annotations

import numpy as np
import pytest

from workers.algo.selection import select_max_variance
from workers.explore.seed_plan import SeedPlan
from workers.explore.state import ExplorationState, ExploreConfig, review_rollout

GROUP, DRAWN, NUM_PROMPTS = 4, 8, 64
CONFIG = ExploreConfig(seed_multipliers=(2,), cache_levels=("half_steps",))
PROMPTS = [f"prompt {i}" for i in range(NUM_PROMPTS)]


def _kept(rewards: list[float]) -> list[float]:
    return [rewards[i] for i in select_max_variance(list(range(len(rewards))), rewards, GROUP)]


def test_explored_seeds_only_as_good_as_the_wider_draws_kept_subset_gain_nothing() -> None:
    rng = np.random.default_rng(0)
    state = ExplorationState.new(CONFIG, group_size=GROUP)
    # Iteration 0 samples the default plan: DRAWN random seeds per prompt, the trainer keeps GROUP of them.
    wide = SeedPlan(0, "default", PROMPTS, [list(range(i * DRAWN, (i + 1) * DRAWN)) for i in range(NUM_PROMPTS)])
    review_rollout(state, CONFIG, 0, wide, [rng.uniform(size=DRAWN).tolist() for _ in PROMPTS], group_size=GROUP)
    # Iteration 1's explored seeds are no better than another wider draw's kept subset.
    real = [_kept(rng.uniform(size=DRAWN).tolist()) for _ in PROMPTS]
    explored = SeedPlan(
        1, "explore:m8-half_steps", PROMPTS, [list(range(i * GROUP, (i + 1) * GROUP)) for i in range(NUM_PROMPTS)], real
    )
    review = review_rollout(state, CONFIG, 1, explored, real, group_size=GROUP)
    assert review.variance_gain == pytest.approx(1.0, abs=0.15)
    assert state.bandit.stats["m8-half_steps"].mean_gain == pytest.approx(1.0, abs=0.15)
    assert review.explored_prompts == [True] * NUM_PROMPTS


def test_a_random_group_of_a_wider_draw_is_judged_on_the_subset_the_trainer_keeps() -> None:
    state = ExplorationState.new(CONFIG, group_size=GROUP)
    rewards = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    wide = SeedPlan(0, "default", ["a"], [list(range(DRAWN))])
    review = review_rollout(state, CONFIG, 0, wide, [rewards], group_size=GROUP)
    assert review.trained_variance == [pytest.approx(float(np.var([0.1, 0.2, 0.7, 0.8])))]
    assert state.random_variance == pytest.approx(float(np.var([0.1, 0.2, 0.7, 0.8])))
    assert state.random_variance > float(np.var(rewards))  # the whole draw would understate the baseline
