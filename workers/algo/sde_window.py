"""A randomly placed SDE window (flow_grpo's `sample.sde_window_size` / `sample.sde_window_range`): each iteration
samples and trains a window of `size` consecutive SDE steps whose start is drawn uniformly within a range; the other
steps follow the ODE.

flow_grpo draws the start in its pipelines' `pipeline_with_logprob` (e.g.
flow_grpo/diffusers_patch/qwenimage_pipeline_with_logprob.py) as `random.randint(lo, hi - size)`, both ends
included, and samples steps [start, start + size) with the SDE. Here the draw is a pure function of (run seed,
iteration), so a resumed or replayed iteration places its window where the first attempt did, and every request,
worker and trainer rank of one iteration agrees on it.

Example:
    place_sde_window(2, (0, 5), run_seed=0, iteration=3)    # (start, start + 2), start in {0, 1, 2, 3}
"""

from __future__ import annotations

import random

from workers.algo.seeds import domain_seed


def check_sde_window_placement(size: int, window_range: tuple[int, int], num_steps: int) -> None:
    """ValueError unless a window of `size` steps fits in `window_range` within [0, num_steps]."""
    lo, hi = window_range
    if size < 1:
        raise ValueError(f"sde_window_size must be >= 1, got {size}")
    if not 0 <= lo < hi <= num_steps:
        raise ValueError(f"sde_window_range {window_range} must satisfy 0 <= low < high <= num_steps={num_steps}")
    if hi - lo < size:
        raise ValueError(f"sde_window_range {window_range} spans {hi - lo} steps, fewer than sde_window_size={size}")


def place_sde_window(size: int, window_range: tuple[int, int], run_seed: int, iteration: int) -> tuple[int, int]:
    """Steps [start, start + size) of `iteration`, start uniform over lo .. hi - size (both included)."""
    lo, hi = window_range
    start = random.Random(domain_seed(run_seed, "sde_window", iteration)).randint(lo, hi - size)
    return (start, start + size)
