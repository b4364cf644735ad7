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


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> str:
    from workers.model.tiny_policy import PolicyConfig, build_policy, save_policy

    folder = tmp_path_factory.mktemp("tiny") / "policy"
    config = PolicyConfig(image_size=16, num_layers=1, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
    save_policy(build_policy(config, seed=0).eval(), folder)  # conftest's tiny_policy, built once for the module
    return str(folder)


def _run(
    run_dir, checkpoint: str, budget: float | None, iterations: int = 2, explore: ExploreConfig = EXPLORE
) -> tuple[RunContext, list[dict]]:
    # A continuous reward: the random tiny policy's images differ in it, so groups have contrast to select.
    config = dataclasses.replace(get_preset("cpu_smoke"), iterations=iterations, reward="jpeg_compressibility")
    ctx = RunContext.local(run_dir, "x", "cpu_smoke", config, checkpoint=checkpoint, report=False)
    ctx = dataclasses.replace(ctx, explore_config=explore, sampling=Sampling(mode="inprocess", explore_samples=budget))
    records = list(train_records(ctx))
    return ctx, records


@pytest.fixture(scope="module")
def explored_run(tmp_path_factory, tiny_checkpoint):
    """One 2-iteration run exploring on a budget of 16 samples, read by several tests."""
    ctx, records = _run(tmp_path_factory.mktemp("explored") / "run", tiny_checkpoint, budget=16.0, iterations=2)
    yield ctx, records
    ctx.ledger.close()


def test_each_iteration_after_the_first_trains_on_seeds_explored_on_the_stale_weights(explored_run) -> None:
    from workers.trainer.checkpoint import load_checkpoint

    ctx, _ = explored_run
    rows = ctx.ledger.query(
        "SELECT iteration, arm, budget_s, time_used_s, num_requests FROM exploration ORDER BY iteration"
    ).as_dicts()
    assert [r["iteration"] for r in rows] == [0, 1] and all(r["budget_s"] == 16.0 for r in rows)
    assert all(r["time_used_s"] <= 16.0 and r["num_requests"] == 2 for r in rows)  # 2 prompts fit every time
    assert rows[0]["arm"] == "m8-quarter_steps"  # every arm untried: the cheapest first (2 prompts x 8 x 0.25 samples)
    plan = load_seed_plan(ctx.store, ctx.run, 1)
    assert plan.planner == "explore:m8-quarter_steps"
    # Iteration 1's candidates were scored on v(0), the weights stale by one update once v(1) exists.
    stale, _ = load_checkpoint(ctx.store, ctx.run, 0)
    config = ctx.train
    candidates = candidate_seeds(config.seed, 1, 0, config.group_size, 8)
    rewards = explore_rewards(
        stale, ExploreSpec("x", plan.prompts[0], tuple(candidates), 0, config.sampler, "quarter_steps", config.reward)
    )
    assert len(set(rewards)) > 2  # contrast to select from: the plan is not just the default seeds
    assert (
        plan.seeds[0] == select_max_variance(candidates, rewards, config.group_size) != candidates[: config.group_size]
    )
    # Off any critical path: no explore phase window in the ledger.
    assert ctx.ledger.query("SELECT count(*) FROM phases WHERE phase = 'explore'").rows[0][0] == 0


def test_a_budget_too_small_for_any_arm_keeps_random_seeds(tmp_path, tiny_checkpoint) -> None:
    ctx, _ = _run(
        tmp_path / "run", tiny_checkpoint, budget=1.0, iterations=2
    )  # the cheapest arm needs 2 prompts x 8 x 0.25 = 4
    try:
        assert load_seed_plan(ctx.store, ctx.run, 1).planner == "random:no-arm-fits-budget"
        assert {r[0] for r in ctx.ledger.query("SELECT arm FROM exploration").rows} == {"none"}
    finally:
        ctx.ledger.close()


@pytest.mark.slow
def test_two_runs_of_one_seed_learn_the_same_curve(tmp_path, tiny_checkpoint, explored_run) -> None:
    from workers.explore.seed_plan import load_seed_plan as plan_of

    first_ctx, first = explored_run
    second_ctx, second = _run(tmp_path / "b", tiny_checkpoint, budget=16.0, iterations=2)  # the same run, again
    second_ctx.ledger.close()
    keep = ("iteration", "reward_mean", "reward_std", "loss")
    trained = [{k: r.get(k) for k in keep} for r in first if r.get("loss") is not None]
    assert len(trained) == 2 and trained == [{k: r.get(k) for k in keep} for r in second if r.get("loss") is not None]
    assert plan_of(first_ctx.store, "x", 1) == plan_of(second_ctx.store, "x", 1)


def test_a_pre_filter_plan_rolls_out_w_seeds_trains_g_and_a_control_prompt_keeps_the_baseline_current(
    tmp_path, tiny_checkpoint
) -> None:
    import numpy as np

    from workers.explore.session import explored_results

    explore = ExploreConfig(seed_multipliers=(2,), cache_levels=("half_steps",), keep_factors=(1.5,), control_prompts=1)
    ctx, _ = _run(tmp_path / "run", tiny_checkpoint, budget=16.0, iterations=2, explore=explore)
    try:
        plan = load_seed_plan(ctx.store, ctx.run, 1)
        assert plan.planner == "explore:m8-half_steps-w6" and plan.control_prompts == (
            1,
        )  # prompt 1 is iteration 1's control
        candidates, stale = explored_results(ctx.store, ctx.run, 0)[0]
        assert set(explored_results(ctx.store, ctx.run, 0)) == {0}  # the control prompt is not explored
        assert plan.seeds[0] == select_max_variance(candidates, stale, 6)  # W = 6 of M = 8, by stale variance
        assert plan.seeds[1] == candidates_of(ctx, 1)  # the control keeps its random seeds
        row = ctx.ledger.query("SELECT num_requests, time_used_s FROM exploration WHERE iteration = 0").as_dicts()[0]
        assert row == {"num_requests": 1, "time_used_s": 4.0}  # 8 candidates x 0.5: the exact cost in samples
        assert (
            ctx.ledger.query("SELECT count(*) FROM requests WHERE kind = 'rollout' AND iteration = 1").rows[0][0] == 10
        )
        groups = ctx.ledger.query(
            "SELECT iteration, prompt_index, source, num_drawn, num_trained, trained_variance, "
            "baseline_variance FROM seed_groups ORDER BY iteration, prompt_index"
        ).as_dicts()
        assert [(g["source"], g["num_drawn"], g["num_trained"]) for g in groups[2:]] == [
            ("explored", 6, 4),
            ("random", 4, 4),
        ]
        # Iteration 1's baseline: iteration 0's random groups, refreshed by the control group on the same weights.
        before = np.mean([g["trained_variance"] for g in groups[:2]])
        assert groups[2]["baseline_variance"] == pytest.approx(0.5 * before + 0.5 * groups[3]["trained_variance"])
    finally:
        ctx.ledger.close()


def candidates_of(ctx: RunContext, prompt_index: int) -> list[int]:
    return candidate_seeds(ctx.train.seed, 1, prompt_index, ctx.train.group_size, ctx.train.group_size)


def test_an_exploration_budget_is_refused_for_queue_workers() -> None:
    with pytest.raises(ValueError, match="explore_samples"):
        Sampling(mode="workers", explore_samples=64)
    with pytest.raises(ValueError, match="explore_samples"):
        Sampling(mode="inprocess", explore_samples=0)
