"""Learning curves over seeds: crossings of a target, paired bootstrap ratios and differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from workers.bench.curves import (
    crossing,
    interval,
    mean_curve,
    paired_crossings,
    paired_difference,
    paired_ratio_interval,
)

VERSIONS = [0, 5, 10, 15]


def test_a_curve_crosses_the_target_between_validations_linearly() -> None:
    assert crossing(VERSIONS, [0.30, 0.32, 0.36, 0.40], 0.34) == pytest.approx(7.5)
    assert crossing(VERSIONS, [0.35, 0.30, 0.30, 0.30], 0.34) == 0.0
    assert crossing(VERSIONS, [0.30, 0.31, 0.32, 0.33], 0.34) is None


def test_a_strategy_that_learns_twice_as_fast_gets_a_ratio_near_two_with_an_interval_around_it() -> None:
    rng = np.random.default_rng(0)
    slope = {"random": 0.004, "explore": 0.008}
    scores = {
        name: [[0.3 + s * v + rng.normal(0, 0.005) * (v > 0) for v in VERSIONS] for _ in range(8)]
        for name, s in slope.items()
    }
    out = paired_ratio_interval(VERSIONS, scores, "random", "explore", 0.34, resamples=500, seed=0)
    assert out["ratio"] == pytest.approx(2.0, rel=0.15)
    assert out["low"] < out["ratio"] < out["high"] and out["low"] > 1.4 and not out["unbounded"]


def test_when_the_slow_strategy_never_reaches_the_target_the_interval_is_unbounded_above() -> None:
    scores = {"random": [[0.30, 0.30, 0.31, 0.31]] * 4, "explore": [[0.30, 0.33, 0.36, 0.38]] * 4}
    out = paired_ratio_interval(VERSIONS, scores, "random", "explore", 0.35, resamples=100, seed=0)
    assert out["ratio"] is None and out["unbounded"] and out["high"] is None
    assert out["slow_never_reached_share"] == 1.0 and out["iterations_to_target"]["random"] is None


def test_strategies_must_share_their_run_seeds() -> None:
    with pytest.raises(ValueError, match="same run seeds"):
        paired_ratio_interval(VERSIONS, {"a": [[0.3] * 4] * 3, "b": [[0.3] * 4] * 2}, "a", "b", 0.35)
    with pytest.raises(ValueError, match="seeds x versions"):
        mean_curve([0.3, 0.4])


def test_a_paired_difference_reports_its_standard_error_and_interval() -> None:
    out = paired_difference({"a": [0.40, 0.42, 0.38, 0.41], "b": [0.35, 0.36, 0.36, 0.34]}, "a", "b", resamples=500)
    assert out["mean"] == pytest.approx(0.05) and out["se"] == pytest.approx(0.0108, abs=1e-4)
    assert out["low"] <= out["mean"] <= out["high"]


def test_an_interval_counts_what_was_undefined() -> None:
    out = interval(np.array([1.0, 2.0, math.nan, math.nan]))
    assert out["undefined_share"] == 0.5 and out["low"] == 1.0 and out["high"] == 2.0


def _bootstrap_by_hand(scores: dict, target: float, resamples: int, seed: int) -> dict:
    """Resample k draws the same seed rows for every strategy (the rows numpy's integers(0, n, (k, n)) gives)."""
    arrays = {name: np.asarray(s) for name, s in scores.items()}
    picks = np.random.default_rng(seed).integers(0, 4, size=(resamples, 4))
    out = {}
    for name, array in arrays.items():
        found = [crossing(VERSIONS, array[pick].mean(axis=0), target) for pick in picks]
        out[name] = np.array([math.nan if c is None else c for c in found])
    return out


def test_scipys_paired_bootstrap_resamples_the_seed_rows_jointly_as_the_hand_written_one_did() -> None:
    rng = np.random.default_rng(3)
    scores = {
        name: (0.3 + s * np.array(VERSIONS) + rng.normal(0, 0.02, (4, 4))).tolist()
        for name, s in (("r", 0.003), ("e", 0.006))
    }
    want = _bootstrap_by_hand(scores, 0.34, 300, seed=7)
    got = paired_crossings(VERSIONS, scores, 0.34, resamples=300, seed=7)
    for name in scores:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, equal_nan=True)
    assert np.isnan(got["r"]).any() and not np.isnan(got["e"]).all()  # both kinds of resample occur
    diff = np.asarray(scores["r"])[:, 1] - np.asarray(scores["e"])[:, 1]
    picks = np.random.default_rng(7).integers(0, 4, size=(300, 4))
    by_hand = interval(diff[picks].mean(axis=1))
    out = paired_difference(
        {"r": np.asarray(scores["r"])[:, 1], "e": np.asarray(scores["e"])[:, 1]}, "r", "e", 300, seed=7
    )
    assert (out["low"], out["high"]) == (by_hand["low"], by_hand["high"])


def test_one_run_seed_gives_a_degenerate_interval_at_its_value() -> None:
    out = paired_difference({"a": [0.40], "b": [0.35]}, "a", "b", resamples=50)
    assert out["low"] == out["high"] == out["mean"] == pytest.approx(0.05) and out["se"] is None
