"""Where a learning curve first reaches a target, linear between its readings: the exploration bench's time to a
target over its mean curve (workers/bench/curves.py) and the simulator's, over a run's validations in elapsed
seconds and dollars (workers/sim/metrics.py).

Example:
    crossing([0, 5, 10], [0.29, 0.31, 0.35], 0.33)      # 7.5
"""

from __future__ import annotations

from typing import Sequence


def crossing(versions: Sequence[float], curve: Sequence[float], target: float) -> float | None:
    """Where on `versions` (weights versions, or elapsed seconds or dollars at each reading) `curve` first reaches
    `target`, linear between readings; None if it never does. A curve that starts at or above the target crosses
    at its first reading."""
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
