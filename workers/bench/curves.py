"""Learning curves over run seeds: when a strategy reaches a target, how sure that is, and paired ratios.

One held-out reading of the tiny task has a standard error of about 0.04, and one run seed's
curve wanders by as much, so "the first validation at or above the target" of a single run
says little. Here a strategy's curve is the mean over run seeds of its held-out scores at
each validated version, the time to a target is where that mean curve first crosses it
(linear between validations), and its uncertainty comes from a paired bootstrap over run
seeds: every resample draws the same seeds for every strategy (they share prompt schedules),
so ratios between strategies keep their pairing.

Example:
    versions = [0, 5, 10]
    scores = {"random": [[0.29, 0.31, 0.35], ...], "explore": [[0.29, 0.34, 0.38], ...]}   # seeds x versions
    crossing(versions, mean_curve(scores["random"]), 0.33)                                  # 8.75
    paired_ratio_interval(versions, scores, "random", "explore", 0.33, resamples=2000, seed=0)
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import numpy as np


def mean_curve(scores_SV: Sequence[Sequence[float]]) -> np.ndarray:
    """Mean over run seeds (rows) of held-out scores at each validated version (columns)."""
    array = np.asarray(scores_SV, dtype=float)
    if array.ndim != 2 or array.shape[0] < 1:
        raise ValueError(f"scores must be seeds x versions with at least one seed, got shape {array.shape}")
    return array.mean(axis=0)


def crossing(versions: Sequence[float], curve: Sequence[float], target: float) -> float | None:
    """The version at which `curve` first reaches `target`, linear between validations; None if it never does.
    A curve that starts at or above the target crosses at its first version."""
    if len(versions) != len(curve) or not len(versions):
        raise ValueError(f"versions ({len(versions)}) and curve ({len(curve)}) must be equally long and non-empty")
    if curve[0] >= target:
        return float(versions[0])
    for i in range(1, len(curve)):
        if curve[i] >= target:
            low, high = curve[i - 1], curve[i]
            share = (target - low) / (high - low)
            return float(versions[i - 1] + share * (versions[i] - versions[i - 1]))
    return None


def paired_crossings(
    versions: Sequence[float], scores: Mapping[str, Sequence[Sequence[float]]], target: float, resamples: int, seed: int
) -> dict[str, np.ndarray]:
    """Per strategy, the crossing of the mean curve of each bootstrap resample of run seeds (NaN: never crossed).
    Every strategy's resample k uses the same seed rows (paired); all must have the same number of rows."""
    arrays = {name: np.asarray(s, dtype=float) for name, s in scores.items()}
    rows = {a.shape[0] for a in arrays.values()}
    if len(rows) != 1:
        raise ValueError(f"every strategy needs the same run seeds, got row counts {sorted(rows)}")
    num_seeds = rows.pop()
    picks = np.random.default_rng(seed).integers(0, num_seeds, size=(resamples, num_seeds))
    out = {}
    for name, array in arrays.items():
        found = [crossing(versions, array[pick].mean(axis=0), target) for pick in picks]
        out[name] = np.array([math.nan if c is None else c for c in found])
    return out


def interval(samples: np.ndarray, level: float = 0.95) -> dict:
    """Median and the central `level` percentile interval (nearest-rank, so +inf samples stay +inf: reported as
    None with `unbounded`) of the samples that are not NaN, and the share that were NaN (undefined)."""
    defined = samples[~np.isnan(samples)]
    undefined = 1.0 - defined.size / samples.size if samples.size else 1.0
    if not defined.size:
        return {"median": None, "low": None, "high": None, "unbounded": False, "undefined_share": round(undefined, 4)}
    tail = 100 * (1 - level) / 2
    values = [float(v) for v in np.percentile(defined, [tail, 50, 100 - tail], method="nearest")]
    low, median, high = (None if math.isinf(v) else round(v, 4) for v in values)
    return {
        "median": median,
        "low": low,
        "high": high,
        "unbounded": math.isinf(values[2]),
        "undefined_share": round(undefined, 4),
    }


def paired_ratio_interval(
    versions: Sequence[float],
    scores: Mapping[str, Sequence[Sequence[float]]],
    slow: str,
    fast: str,
    target: float,
    resamples: int = 2000,
    seed: int = 0,
    scale: float = 1.0,
) -> dict:
    """The ratio slow / fast of versions to the target, times `scale` (e.g. a ratio of seconds per iteration):
    the point estimate from the mean curves, and a paired bootstrap interval over run seeds. A resample where
    `slow` never reaches the target but `fast` does counts as +inf (fast is at least that much faster); one
    where `fast` never does is undefined."""
    point_slow = crossing(versions, mean_curve(scores[slow]), target)
    point_fast = crossing(versions, mean_curve(scores[fast]), target)
    boot = paired_crossings(versions, {slow: scores[slow], fast: scores[fast]}, target, resamples, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        slow_b = np.where(np.isnan(boot[slow]) & np.isfinite(boot[fast]), np.inf, boot[slow])
        ratios = scale * slow_b / boot[fast]
    ratios[~np.isfinite(boot[fast]) | (boot[fast] <= 0)] = math.nan
    point = None if point_slow is None or not point_fast else round(scale * point_slow / point_fast, 4)
    return {
        "ratio": point,
        **interval(ratios),
        "slow_never_reached_share": round(float(np.mean(np.isinf(ratios))), 4),
        "iterations_to_target": {slow: point_slow, fast: point_fast},
    }


def paired_difference(
    values: Mapping[str, Sequence[float]], a: str, b: str, resamples: int = 2000, seed: int = 0
) -> dict:
    """Mean of a - b over run seeds (paired), its standard error and a bootstrap 95 % interval."""
    diff = np.asarray(values[a], dtype=float) - np.asarray(values[b], dtype=float)
    if diff.size < 1:
        raise ValueError("paired_difference needs at least one run seed")
    picks = np.random.default_rng(seed).integers(0, diff.size, size=(resamples, diff.size))
    boot = diff[picks].mean(axis=1)
    se = float(diff.std(ddof=1) / math.sqrt(diff.size)) if diff.size > 1 else None
    return {
        "mean": round(float(diff.mean()), 4),
        "se": None if se is None else round(se, 4),
        **{k: v for k, v in interval(boot).items() if k in ("low", "high")},
    }
