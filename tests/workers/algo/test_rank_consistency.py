"""Kendall's tau-b and Spearman's rho through scipy equal their textbook definitions on tie-heavy rewards."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from workers.algo.rank_consistency import kendall_tau_b, spearman_rho


def _tau_b_by_pairs(a: np.ndarray, b: np.ndarray) -> float:
    i, j = np.triu_indices(len(a), k=1)
    da, db = np.sign(a[i] - a[j]), np.sign(b[i] - b[j])
    pairs = float(np.count_nonzero(da)) * float(np.count_nonzero(db))
    return math.nan if pairs == 0 else float(np.sum(da * db)) / math.sqrt(pairs)


def _average_ranks(a: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(a))
    ranks[np.argsort(a, kind="stable")] = np.arange(len(a), dtype=float)
    for value in np.unique(a):
        ranks[a == value] = ranks[a == value].mean()
    return ranks


def _rho_by_ranks(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2:
        return math.nan
    ra, rb = _average_ranks(a) - (len(a) - 1) / 2, _average_ranks(b) - (len(b) - 1) / 2
    denom = math.sqrt(float(np.sum(ra * ra)) * float(np.sum(rb * rb)))
    return math.nan if denom == 0 else float(np.sum(ra * rb)) / denom


@pytest.mark.parametrize(("metric", "reference"), [(kendall_tau_b, _tau_b_by_pairs), (spearman_rho, _rho_by_ranks)])
def test_scipy_rank_correlations_equal_the_definitions_on_discrete_rewards_with_ties(metric, reference) -> None:
    rng = np.random.default_rng(0)
    defined = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a constant group is NaN without scipy's ConstantInputWarning
        for _ in range(500):
            n = int(rng.integers(0, 10))
            x, y = rng.integers(0, 4, n) / 4, rng.integers(0, 4, n) / 4  # a share of 4 criteria passed
            want, got = reference(x, y), metric(x, y)
            assert (math.isnan(want) and math.isnan(got)) or got == pytest.approx(want, abs=1e-12), (x, y)
            defined += not math.isnan(want)
    assert defined > 300  # most groups have a ranking on both sides: the comparison is not all NaN


def test_sequences_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="spearman_rho needs two 1-D sequences of one length"):
        spearman_rho([1, 2, 3], [1, 2])
