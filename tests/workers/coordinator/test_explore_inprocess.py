"""Exploration in process on a budget counted in samples: plans like a spot pool's, a function of the run's seed."""

from __future__ import annotations

import dataclasses

import pytest

from workers.algo.seeds import candidate_seeds
from workers.algo.selection import select_max_variance
from workers.coordinator.context import RunContext, Sampling
from workers.coordinator.driver import train_records
from workers.explore.request import ExploreSpec, explore_rewards
from workers.explore.seed_plan import load_seed_plan
from workers.explore.state import ExploreConfig
from workers.trainer.presets import get_preset

EXPLORE = ExploreConfig(seed_multipliers=(2, 3), cache_levels=("half_steps", "quarter_steps"))  # one block: no fbcache


@pytest.fixture
def tiny_checkpoint(tmp_path, tiny_policy):
    import torch

    from workers.model.policy import save_policy

    torch.set_num_threads(1)
    save_policy(tiny_policy, tmp_path / "tiny")
    return str(tmp_path / "tiny")


def _run(run_dir, checkpoint: str, budget: float | None) -> tuple[RunContext, list[dict]]:
    config = dataclasses.replace(get_preset("cpu_smoke"), iterations=3)
    ctx = RunContext.local(run_dir, "x", "cpu_smoke", config, checkpoint=checkpoint, report=False)
    ctx = dataclasses.replace(ctx, explore_config=EXPLORE, sampling=Sampling(mode="inprocess", explore_samples=budget))
    records = list(train_records(ctx))
    return ctx, records


def test_each_iteration_after_the_first_trains_on_seeds_explored_on_the_stale_weights(tmp_path, tiny_checkpoint) -> None:
    from workers.trainer.checkpoint import load_checkpoint

    ctx, _ = _run(tmp_path / "run", tiny_checkpoint, budget=16.0)
    try:
        rows = ctx.ledger.query("SELECT iteration, arm, budget_s, time_used_s, num_requests FROM exploration "
                                "ORDER BY iteration").as_dicts()
        assert [r["iteration"] for r in rows] == [0, 1, 2] and all(r["budget_s"] == 16.0 for r in rows)
        assert all(r["time_used_s"] <= 16.0 and r["num_requests"] == 2 for r in rows)  # 2 prompts fit every time
        assert rows[0]["arm"] == "m8-quarter_steps"  # every arm untried: the cheapest first (2 prompts x 8 x 0.25 samples)
        plan = load_seed_plan(ctx.store, ctx.run, 1)
        assert plan.planner == "explore:m8-quarter_steps"
        # Iteration 1's candidates were scored on v(0), the weights stale by one update once v(1) exists.
        stale, _ = load_checkpoint(ctx.store, ctx.run, 0)
        config = ctx.train
        candidates = candidate_seeds(config.seed, 1, 0, config.group_size, 8)
        rewards = explore_rewards(stale, ExploreSpec("x", plan.prompts[0], tuple(candidates), 0, config.sampler,
                                                     "quarter_steps"))
        assert plan.seeds[0] == select_max_variance(candidates, rewards, config.group_size)
        # Off any critical path: no explore phase window in the ledger.
        assert ctx.ledger.query("SELECT count(*) FROM phases WHERE phase = 'explore'").rows[0][0] == 0
    finally:
        ctx.ledger.close()


def test_a_budget_too_small_for_any_arm_keeps_random_seeds(tmp_path, tiny_checkpoint) -> None:
    ctx, _ = _run(tmp_path / "run", tiny_checkpoint, budget=1.0)  # the cheapest arm needs 2 prompts x 8 x 0.25 = 4
    try:
        assert load_seed_plan(ctx.store, ctx.run, 1).planner == "random:no-arm-fits-budget"
        assert {r[0] for r in ctx.ledger.query("SELECT arm FROM exploration").rows} == {"none"}
    finally:
        ctx.ledger.close()


@pytest.mark.slow
def test_two_runs_of_one_seed_learn_the_same_curve(tmp_path, tiny_checkpoint) -> None:
    first_ctx, first = _run(tmp_path / "a", tiny_checkpoint, budget=16.0)
    second_ctx, second = _run(tmp_path / "b", tiny_checkpoint, budget=16.0)
    first_ctx.ledger.close()
    second_ctx.ledger.close()
    keep = ("iteration", "reward_mean", "reward_std", "loss", "validation_score")
    assert [{k: r.get(k) for k in keep} for r in first] == [{k: r.get(k) for k in keep} for r in second]


def test_an_exploration_budget_is_refused_for_queue_workers() -> None:
    with pytest.raises(ValueError, match="explore_samples"):
        Sampling(mode="workers", explore_samples=64)
    with pytest.raises(ValueError, match="explore_samples"):
        Sampling(mode="inprocess", explore_samples=0)
