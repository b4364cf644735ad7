"""Learning curves over run seeds: when a strategy reaches a target, how sure that is, and paired ratios.

One held-out reading of the tiny task has a standard error of about 0.04, and one run seed's
curve wanders by as much, so "the first validation at or above the target" of a single run
says little. Here a strategy's curve is the mean over run seeds of its held-out scores at
each validated version, the time to a target is where that mean curve first crosses it
(linear between validations), and its uncertainty comes from a paired bootstrap over run
seeds (scipy.stats.bootstrap, paired=True): every resample draws the same seeds for every strategy
(they share prompt schedules), so ratios between strategies keep their pairing.

Example:
    versions = [0, 5, 10]
    scores = {"random": [[0.29, 0.31, 0.35], ...], "explore": [[0.29, 0.34, 0.38], ...]}   # seeds x versions
    crossing(versions, mean_curve(scores["random"]), 0.33)                                  # 8.75
    paired_ratio_interval(versions, scores, "random", "explore", 0.33, resamples=2000, seed=0)
"""

from __future__ import annotations

import math
import warnings
from typing import Callable, Mapping, Sequence

import numpy as np
from scipy import stats

from workers.algo.crossing import crossing  # one definition, shared with the simulator (workers/sim/metrics.py)


def mean_curve(scores_SV: Sequence[Sequence[float]]) -> np.ndarray:
    """Mean over run seeds (rows) of held-out scores at each validated version (columns)."""
    array = np.asarray(scores_SV, dtype=float)
    if array.ndim != 2 or array.shape[0] < 1:
        raise ValueError(f"scores must be seeds x versions with at least one seed, got shape {array.shape}")
    return array.mean(axis=0)


def paired_crossings(
    versions: Sequence[float], scores: Mapping[str, Sequence[Sequence[float]]], target: float, resamples: int, seed: int
) -> dict[str, np.ndarray]:
    """Per strategy, the crossing of the mean curve of each bootstrap resample of run seeds (NaN: never crossed).
    Every strategy's resample k uses the same seed rows (scipy.stats.bootstrap, paired); all must have the same
    number of rows."""
    arrays = {name: np.asarray(s, dtype=float) for name, s in scores.items()}
    rows = {a.shape[0] for a in arrays.values()}
    if len(rows) != 1:
        raise ValueError(f"every strategy needs the same run seeds, got row counts {sorted(rows)}")

    def statistic(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.stack([_crossings(versions, sample.mean(axis=axis), target) for sample in samples])

    boot = bootstrap_distribution(tuple(arrays.values()), statistic, resamples, seed, paired=True)
    return dict(zip(arrays, boot, strict=True))


def _crossings(versions: Sequence[float], curves: np.ndarray, target: float) -> np.ndarray:
    """`crossing` of each curve along axis 0 (versions), NaN where it never reaches the target."""
    flat = curves.reshape(curves.shape[0], -1)
    found = [crossing(versions, flat[:, k], target) for k in range(flat.shape[1])]
    return np.array([math.nan if c is None else c for c in found]).reshape(curves.shape[1:])


def bootstrap_distribution(
    samples: tuple[np.ndarray, ...], statistic: Callable[..., np.ndarray], resamples: int, seed: int, paired: bool
) -> np.ndarray:
    """The statistic of `resamples` bootstrap resamples of the samples' rows (scipy.stats.bootstrap, vectorized:
    `statistic(*samples, axis=-1)`, the resampled rows on the last axis), resample index on the last axis.

    Only scipy's resampling is used: the intervals come from `interval` (nearest rank), which keeps the +inf
    and NaN resamples a crossing ratio has; scipy's percentile interval would interpolate or drop them. With one
    row every resample is that row (scipy needs two)."""
    if samples[0].shape[0] < 2:
        return np.repeat(statistic(*[np.moveaxis(s, 0, -1) for s in samples])[..., None], resamples, axis=-1)
    with warnings.catch_warnings():  # scipy's own interval is NaN over NaN resamples; it is not used here
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        result = stats.bootstrap(
            samples,
            statistic,
            n_resamples=resamples,
            vectorized=True,
            paired=paired,
            axis=0,
            method="percentile",
            rng=np.random.default_rng(seed),
        )
    return result.bootstrap_distribution


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
    boot = bootstrap_distribution((diff,), np.mean, resamples, seed, paired=False)
    se = float(diff.std(ddof=1) / math.sqrt(diff.size)) if diff.size > 1 else None
    return {
        "mean": round(float(diff.mean()), 4),
        "se": None if se is None else round(se, 4),
        **{k: v for k, v in interval(boot).items() if k in ("low", "high")},
    }
