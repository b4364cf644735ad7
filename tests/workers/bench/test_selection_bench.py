"""`spotlight bench selection`: each strategy's trained groups scored on the fresh weights,
against concurrent random groups."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workers.bench.selection import SelectionBench, random_baseline, run_selection_bench, score_pair

SMALL = dict(preset="cpu_smoke", num_prompts=4, num_candidates=8, pairs_at=(0,), levels=("half_steps",))  # G = 4, W = 6


def test_strategies_are_scored_on_fresh_rewards_against_every_random_block() -> None:
    bench = SelectionBench(**SMALL)
    config = bench.train_config()
    rng = np.random.default_rng(0)
    fresh = rng.uniform(size=(4, 8)).round(3)
    half = 1.0 - fresh  # a cheap level that ranks the candidates backwards
    half[3] = 0.5  # prompt 3: every candidate scored alike, nothing to choose between
    pair = score_pair(0, {"none": fresh, "half_steps": half}, fresh, bench, config)
    s = pair["strategies"]
    assert set(s) == {
        "random",
        "wider_draw",
        "fresh_oracle",
        "stale_none",
        "prefilter_none",
        "stale_half_steps",
        "prefilter_half_steps",
        "planner",
    }
    assert all(set(v) == {"variance_ratio", "zero_std_share", "rollout_cost"} for v in s.values())
    baseline = np.mean([np.var(row[:4]) for row in fresh] + [np.var(row[4:]) for row in fresh])
    assert pair["random_variance"] == pytest.approx(baseline)
    assert s["random"]["variance_ratio"] == pytest.approx(
        np.mean([np.var(row[:4]) for row in fresh]) / baseline, abs=1e-4
    )
    # Stale rewards equal to the fresh ones pick what the fresh oracle picks; nothing beats the oracle.
    assert s["stale_none"]["variance_ratio"] == s["fresh_oracle"]["variance_ratio"]
    assert all(v["variance_ratio"] <= s["fresh_oracle"]["variance_ratio"] for v in s.values())
    assert s["wider_draw"]["variance_ratio"] >= s["random"]["variance_ratio"]
    assert pair["kendall_tau"] == {"none": 1.0, "half_steps": -1.0}  # prompt 3 (constant) has no ranking
    # Samples drawn on the critical path per prompt, over G: the planner widens only the contested prompts.
    costs = {name: v["rollout_cost"] for name, v in s.items()}
    assert costs == {
        "random": 1.0,
        "wider_draw": 2.0,
        "fresh_oracle": 2.0,
        "stale_none": 1.0,
        "stale_half_steps": 1.0,
        "prefilter_none": 1.5,
        "prefilter_half_steps": 1.5,
        "planner": (3 * 6 + 4) / 16,
    }


def test_groups_whose_rewards_are_all_equal_count_as_zero_variance() -> None:
    bench = SelectionBench(**SMALL)
    fresh = np.zeros((4, 8))
    fresh[0, 5] = 1.0  # one pass among prompt 0's candidates, outside the random group
    pair = score_pair(0, {"none": fresh, "half_steps": fresh}, fresh, bench, bench.train_config())
    assert pair["strategies"]["random"]["zero_std_share"] == 1.0 and pair["strategies"]["random"]["variance_ratio"] == 0
    assert pair["strategies"]["stale_none"]["zero_std_share"] == 0.75  # the pass found: prompt 0 has contrast
    assert random_baseline(np.zeros((2, 8)), 4) == 0.0
    assert (
        score_pair(
            0, {"none": np.zeros((4, 8)), "half_steps": np.zeros((4, 8))}, np.zeros((4, 8)), bench, bench.train_config()
        )["strategies"]["random"]["variance_ratio"]
        is None
    )  # no contrast to divide by


def test_the_smallest_bench_trains_a_pair_and_reports_every_strategy(tmp_path) -> None:
    figures = run_selection_bench(SelectionBench(**{**SMALL, "num_prompts": 2}))
    json.dumps(figures)  # plain JSON
    s = figures["strategies"]
    assert all(set(v) == {"variance_ratio", "zero_std_share", "rollout_cost"} for v in s.values())
    assert [p["k"] for p in figures["pairs"]] == [0] and figures["planner_arm"] == "m8-half_steps-w6"
    assert all(v["variance_ratio"] <= s["fresh_oracle"]["variance_ratio"] for v in s.values())
    assert s["wider_draw"]["variance_ratio"] >= s["random"]["variance_ratio"]
    assert set(figures["kendall_tau"]) == {"none", "half_steps"}


@pytest.mark.parametrize(
    "change,message",
    [
        ({"planner_level": "quarter_steps"}, "planner_level"),
        ({"num_candidates": 5}, "num_candidates"),
        ({"pairs_at": (0, 0)}, "pairs_at"),
        ({"keep_factor": 0.5}, "keep_factor"),
        ({"levels": ("warp",)}, "unknown cache level"),
    ],
)
def test_bad_selection_settings_are_refused_before_any_compute(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SelectionBench(**{**SMALL, **change})
