"""The reward-hacking rule: from each validation's signals, decide whether the run is gaming its training reward.

Two tests, either fires:

- `proxy_up_gold_down`: between the validation `window` validations back (or the first since the base or the
  last rollback) and this one, the proxy (training) reward on the held-out images rose by more than `z`
  standard errors of the difference and the gold reward fell by more than `z` of its own. Both must move:
  a proxy that rises alone is learning; a gold that falls alone is noise or a bad step, which the validation
  guard already watches.
- `drift:<statistic>`: a cheap image statistic (workers/task/image_stats.py) of the held-out images fell
  more than `max_drop` (relative) below the base's: images going flat, grey, blank or identical; or, when
  `max_rise` is set, rose more than that above it (over-saturation, grid artifacts). Rises are off by
  default: a healthy run's images gain detail (compressed size +58 % within 5 iterations of the tiny model).

Standard errors are of the mean over the held-out images (sample std / sqrt(n)); the difference of two
validations takes the root sum of squares, which ignores that the fixed seeds pair the images, so the rule
errs on the quiet side.

Example:
    rule = HackingRule(window=2, z=2.0, max_drop=0.5)
    verdict = judge(history, base, rule)      # history: Signals since the base (or the last rollback), last = now
    if verdict.flagged: print(verdict.rule, verdict.detail)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence

DRIFT_STATISTICS = ("edge_density", "colour_entropy", "saturation", "compressed_bytes", "diversity")
PROXY_RULE = "proxy_up_gold_down"


@dataclass(frozen=True)
class Signals:
    """One validation's signals on the held-out images."""

    iteration: int
    proxy: float
    """Mean training (proxy) reward of the held-out images."""
    proxy_se: float
    """Its standard error (std / sqrt(n))."""
    gold: float
    """Mean gold (validation) reward of the held-out images."""
    gold_se: float
    stats: Mapping[str, float] = field(default_factory=dict)
    """Image statistic name -> mean over the held-out images."""


@dataclass(frozen=True)
class HackingRule:
    """When a validation is flagged as reward hacking."""

    window: int = 2
    """How many validations back the proxy/gold comparison reaches (never past the base or the last rollback)."""
    z: float = 2.0
    """Standard errors of the difference that the proxy's rise and the gold's fall must each exceed."""
    max_drop: float | None = 0.5
    """Largest relative fall of an image statistic below the base's, 1 - x / x_base; None: never fires."""
    max_rise: float | None = None
    """Largest relative rise above the base's, x / x_base - 1; None: rises never fire."""
    drift_statistics: tuple[str, ...] = DRIFT_STATISTICS
    """The statistics the drift test watches."""

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window (validations back) must be an integer >= 1, got {self.window!r}")
        if not (math.isfinite(self.z) and self.z >= 0):
            raise ValueError(f"z (standard errors) must be a finite number >= 0, got {self.z!r}")
        if self.max_drop is not None and not (math.isfinite(self.max_drop) and 0 < self.max_drop < 1):
            raise ValueError(f"max_drop (relative fall) must lie in (0, 1) or be None, got {self.max_drop!r}")
        if self.max_rise is not None and not (math.isfinite(self.max_rise) and self.max_rise > 0):
            raise ValueError(f"max_rise (relative rise) must be > 0 or None, got {self.max_rise!r}")
        unknown = sorted(set(self.drift_statistics) - set(DRIFT_STATISTICS))
        if unknown:
            raise ValueError(f"drift_statistics: unknown {unknown}; choose from {DRIFT_STATISTICS}")


@dataclass(frozen=True)
class Verdict:
    flagged: bool
    rule: str | None = None
    """Which test fired: PROXY_RULE or `drift:<statistic>`; None when none did."""
    detail: str = ""
    """The numbers behind it, for a person."""


def standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean of `values` (sample std / sqrt(n)); 0 for fewer than two."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def proxy_gold_test(history: Sequence[Signals], rule: HackingRule) -> Verdict:
    """PROXY_RULE on the last entry of `history` against the one `rule.window` entries before it (or the first)."""
    if len(history) < 2:
        return Verdict(False)
    now, ref = history[-1], history[max(0, len(history) - 1 - rule.window)]
    d_proxy, se_proxy = now.proxy - ref.proxy, math.hypot(now.proxy_se, ref.proxy_se)
    d_gold, se_gold = now.gold - ref.gold, math.hypot(now.gold_se, ref.gold_se)
    if d_proxy > rule.z * se_proxy and d_gold < -rule.z * se_gold:
        return Verdict(
            True,
            PROXY_RULE,
            f"since iteration {ref.iteration}: proxy {d_proxy:+.4g} "
            f"(> {rule.z:g} x {se_proxy:.3g}), gold {d_gold:+.4g} (< -{rule.z:g} x {se_gold:.3g})",
        )
    return Verdict(False)


def drift_test(now: Signals, base: Signals, rule: HackingRule) -> Verdict:
    """`drift:<statistic>` for the statistic furthest past its bound (`max_drop` below, `max_rise` above the
    base's), measured in multiples of that bound."""
    worst: tuple[float, float, str] | None = None
    for name in rule.drift_statistics:
        x, x0 = now.stats.get(name), base.stats.get(name)
        if x is None or x0 is None or not (math.isfinite(x) and math.isfinite(x0)) or x0 <= 0:
            continue
        change = x / x0 - 1.0
        bound = rule.max_drop if change < 0 else rule.max_rise
        if bound is not None and abs(change) > bound and (worst is None or abs(change) / bound > worst[0]):
            worst = (abs(change) / bound, change, name)
    if worst is None:
        return Verdict(False)
    _, change, name = worst
    bound = rule.max_drop if change < 0 else rule.max_rise
    return Verdict(
        True,
        f"drift:{name}",
        f"{name} {now.stats[name]:.4g} is {change:+.0%} from the base's "
        f"{base.stats[name]:.4g} (bound {'-' if change < 0 else '+'}{100 * bound:.3g}%)",
    )


def judge(history: Sequence[Signals], base: Signals, rule: HackingRule) -> Verdict:
    """Whether the last validation in `history` (the validations since the base or the last rollback, oldest
    first) is flagged: PROXY_RULE first, then the drift test against `base`."""
    if not history:
        raise ValueError("judge needs at least the validation being judged")
    verdict = proxy_gold_test(history, rule)
    return verdict if verdict.flagged else drift_test(history[-1], base, rule)
