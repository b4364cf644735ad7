"""Rank agreement between two scorings of the same seeds: Kendall's tau-b, Spearman's rho, pairwise concordance.

The exploration monitor scores a prompt's seeds twice: explored (stale weights, cheap
sampler) and real (the rollout on fresh weights). Rewards are discrete (a share of
criteria passed), so ties are common: tau-b and average ranks (scipy.stats) treat them properly. A group
where either scoring is constant has no ranking to agree with: it is skipped (NaN), not
counted as agreement.

Example:
    kendall_tau_b([0.2, 0.5, 0.9], [0.1, 0.6, 0.7])            # 1.0
    mean_over_groups(kendall_tau_b, explored_groups, real_groups)
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

import numpy as np
from scipy import stats


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b in [-1, 1] (scipy.stats.kendalltau); NaN when either side is constant or shorter than 2."""
    a, b = _pair(x, y, "kendall_tau_b")
    if _constant(a) or _constant(b):
        return math.nan
    return float(stats.kendalltau(a, b, variant="b").statistic)


def pairwise_concordance(x: Sequence[float], y: Sequence[float]) -> float:
    """Share of pairs ordered the same way by both scorings, among pairs untied on both; NaN if none.
    (The ledger's `rank_consistency`: 0.5 is chance, 1 is the same order.)"""
    a, b = _pair(x, y, "pairwise_concordance")
    i, j = np.triu_indices(len(a), k=1)
    prod = np.sign(a[i] - a[j]) * np.sign(b[i] - b[j])
    untied = np.count_nonzero(prod)
    return math.nan if untied == 0 else float(np.count_nonzero(prod > 0)) / untied


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho (scipy.stats.spearmanr: Pearson on average ranks); NaN when either side is constant."""
    a, b = _pair(x, y, "spearman_rho")
    if _constant(a) or _constant(b):
        return math.nan
    return float(stats.spearmanr(a, b).statistic)


def _pair(x: Sequence[float], y: Sequence[float], name: str) -> tuple[np.ndarray, np.ndarray]:
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"{name} needs two 1-D sequences of one length, got {a.shape} and {b.shape}")
    return a, b


def _constant(a: np.ndarray) -> bool:
    """No ranking to agree with (scipy would warn and return NaN): fewer than two distinct values."""
    return len(a) < 2 or bool(np.all(a == a[0]))


def per_group(
    metric: Callable[[Sequence[float], Sequence[float]], float],
    xs: Sequence[Sequence[float]],
    ys: Sequence[Sequence[float]],
) -> list[float]:
    """The metric within each group (NaN for groups without a ranking)."""
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} groups against {len(ys)}")
    return [metric(x, y) for x, y in zip(xs, ys, strict=False)]


def mean_over_groups(
    metric: Callable[[Sequence[float], Sequence[float]], float],
    xs: Sequence[Sequence[float]],
    ys: Sequence[Sequence[float]],
) -> float | None:
    """Mean of the metric over groups that have a ranking on both sides; None when none has."""
    values = [v for v in per_group(metric, xs, ys) if not math.isnan(v)]
    return float(np.mean(values)) if values else None
