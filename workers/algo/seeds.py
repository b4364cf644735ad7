"""Request seeds: every rollout and exploration seed as a pure function of (run seed, iteration, prompt, sample).

Example:
    request_seed(0, 3, 1, 5)                 # the default seed of iteration 3, prompt 1, sample 5
    candidate_seeds(0, 3, 1, 8, 16)          # its 8 default seeds, then 8 more to explore
"""

from __future__ import annotations

from workers.algo.sde import noise_seed


def request_seed(seed: int, iteration: int, prompt_index: int, sample_index: int) -> int:
    """The default (unexplored) seed of one rollout request."""
    return noise_seed(seed, (iteration * 1_000 + prompt_index) * 1_000 + sample_index) % 2**31


def candidate_seeds(run_seed: int, iteration: int, prompt_index: int, group_size: int, num_candidates: int) -> list[int]:
    """The M candidate seeds of one prompt: the G default request seeds first (so random seeds are always
    among those explored, and the monitor can still compare on them), then M - G more, deterministic."""
    if num_candidates < group_size:
        raise ValueError(f"num_candidates={num_candidates} must be >= group_size={group_size}")
    seeds = [request_seed(run_seed, iteration, prompt_index, j) for j in range(group_size)]
    extra = 0
    while len(seeds) < num_candidates:
        s = noise_seed(run_seed, 30_000_000_000 + (iteration * 1_000 + prompt_index) * 10_000 + extra) % 2**31
        extra += 1
        if s not in seeds:
            seeds.append(s)
    return seeds
