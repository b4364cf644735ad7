"""Which seeds of a prompt form its GRPO group: the subset of largest reward variance.

Example:
    seeds = select_max_variance(candidates, rewards, 8)   # the 8 whose rewards spread most
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def select_max_variance(seeds: Sequence[int], rewards: Sequence[float], group_size: int) -> list[int]:
    """The `group_size` seeds whose rewards have the largest variance, in candidate order. A max-variance
    subset is always the k lowest plus the group_size - k highest rewards, so every k is tried; ties go
    to the most balanced split, and equal rewards to the earlier candidate, so the choice is deterministic."""
    if len(seeds) != len(rewards):
        raise ValueError(f"{len(seeds)} seeds but {len(rewards)} rewards")
    if not 1 <= group_size <= len(seeds):
        raise ValueError(f"group_size={group_size} must lie in [1, {len(seeds)}]")
    ascending = sorted(range(len(seeds)), key=lambda i: (rewards[i], i))
    descending = sorted(range(len(seeds)), key=lambda i: (-rewards[i], i))
    values = np.asarray(rewards, dtype=np.float64)
    best, best_key = None, None
    for low in range(group_size + 1):
        lows = ascending[:low]
        picked = lows + [i for i in descending if i not in lows][: group_size - low]
        variance = float(np.var(values[picked]))
        key = (round(variance, 12), -abs(2 * low - group_size))
        if best_key is None or key > best_key:
            best, best_key = picked, key
    return [seeds[i] for i in sorted(best)]
