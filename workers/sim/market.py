"""Spot markets: when each spot GPU slot is preempted, from an interruption band, a renewal process or a CSV trace.

- A band of AWS Spot Instance Advisor ("<5%", "5-10%", "10-15%", "15-20%", ">20%"): the
  share of instances interrupted per month. We take the band's midpoint f (25 % for
  ">20%", an assumption) as P(an instance is interrupted within 730 h), so each slot is
  preempted at the constant hazard -ln(1 - f) / 730 per hour.
- `renewal:MEAN_H[:SHAPE]`: a renewal process with Weibull gaps of mean MEAN_H hours per
  slot (shape 1 is Poisson; < 1 bursty, as the Alibaba spot trace's lifetimes are).
- A CSV path in resources/cluster/preemption.py's format (time_s,worker,notice_s), replayed as is.

Example:
    market = parse_market("10-15%")
    events = market.events(["g0", "g1"], duration_s=3600, seed=0)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from resources.cluster.preemption import PreemptionEvent, load_trace_csv

HOURS_PER_MONTH = 730.0
BANDS = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25}
"""AWS Spot Instance Advisor band -> monthly interruption share (band midpoint; '>20%' taken as 25 %)."""
AWS_NOTICE_S = 120.0


@dataclass(frozen=True)
class Market:
    """A spot market: how often and with what notice spot slots are preempted."""

    name: str
    mean_gap_h: float | None = None
    """Mean hours between preemptions of one slot (None: a replayed trace)."""
    shape: float = 1.0
    """Weibull shape of the gaps (1: Poisson)."""
    notice_s: float = AWS_NOTICE_S
    notice_share: float = 1.0
    """Share of preemptions that come with notice (AWS always gives 2 minutes)."""
    trace: tuple[PreemptionEvent, ...] | None = None

    def events(self, slots: Iterable[str], duration_s: float, seed: int = 0) -> list[PreemptionEvent]:
        """Preemptions of `slots` within `duration_s` seconds (a trace keeps only events on known slots)."""
        names = list(slots)
        if self.trace is not None:
            return [e for e in self.trace if e.worker in set(names) and e.time_s < duration_s]
        rng = random.Random(seed)
        scale_s = self.mean_gap_h * 3600 / math.gamma(1 + 1 / self.shape)
        out = []
        for name in names:
            t = 0.0
            while True:
                t += rng.weibullvariate(scale_s, self.shape)
                if t >= duration_s:
                    break
                notice = self.notice_s if rng.random() < self.notice_share else 0.0
                out.append(PreemptionEvent(round(t, 3), name, notice))
        return sorted(out)

    @property
    def preemptions_per_gpu_hour(self) -> float | None:
        return None if self.mean_gap_h is None else 1 / self.mean_gap_h


def parse_market(text: str) -> Market:
    """A band name, `none`, `renewal:MEAN_H[:SHAPE]`, or a trace CSV path; ValueError says which forms exist."""
    text = str(text).strip()
    forms = f"one of {sorted(BANDS)}, none, renewal:MEAN_HOURS[:SHAPE], or a CSV trace (time_s,worker,notice_s)"
    if text == "none":
        return Market("none", mean_gap_h=math.inf)
    if text in BANDS:
        hazard = -math.log(1 - BANDS[text]) / HOURS_PER_MONTH
        return Market(f"AWS band {text}", mean_gap_h=1 / hazard)
    if text.startswith("renewal:"):
        parts = text.split(":")[1:]
        try:
            mean_h, shape = float(parts[0]), float(parts[1]) if len(parts) > 1 else 1.0
        except (ValueError, IndexError):
            raise ValueError(
                f"--market {text!r}: write renewal:MEAN_HOURS or renewal:MEAN_HOURS:SHAPE, e.g. renewal:2:0.7"
            ) from None
        if not (mean_h > 0 and shape > 0) or len(parts) > 2:
            raise ValueError(f"--market {text!r}: MEAN_HOURS and SHAPE must be > 0")
        return Market(f"renewal mean {mean_h:g} h, shape {shape:g}", mean_gap_h=mean_h, shape=shape)
    if Path(text).is_file():
        return Market(f"trace {text}", trace=tuple(load_trace_csv(text)))
    raise ValueError(f"--market {text!r} is not {forms}")
