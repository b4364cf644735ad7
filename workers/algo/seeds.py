"""Every seed a run derives from its run seed, one disjoint domain per use, as a pure function of its indices.

`domain_seed(run_seed, domain, *indices)` is blake2b-64 (top bit cleared: 63 bits, what torch
and the ledger's BIGINT take) of `spotlight-seed/2:{domain}:{run_seed}:{i0}:{i1}:...`.
That text is an injective encoding (a fixed arity per domain, decimal integers, ':' in no
domain name), so distinct (domain, run seed, indices) never share an input; the hash keeps
them apart with probability 1 - n^2 / 2^64 for n seeds, and no count is bounded (an
earlier scheme packed (iteration, prompt, sample) into one counter, so 1,000 prompts or
samples per iteration wrapped into the next iteration, and request seeds of iteration 10
met the prompt schedule of iteration 0).

Domains (`DOMAINS`, with their indices):
    request      (iteration, prompt, sample)  a rollout request's default seed
    candidate    (iteration, prompt, extra)   exploration candidates beyond the default seeds
    prompts      (iteration,)                 the prompt schedule's generator
    minibatches  (iteration,)                 the trainer's minibatch shuffle (and NFT's noise)
    sde_window   (iteration,)                 the start of a randomly placed SDE window (workers/algo/sde_window.py)
    init_noise   (iteration, prompt)          a group's shared initial noise (sampling.init_same_noise)

Example:
    request_seed(0, 3, 1, 5)                 # the default seed of iteration 3, prompt 1, sample 5
    candidate_seeds(0, 3, 1, 8, 16)          # its 8 default seeds, then 8 more to explore
    domain_seed(0, "prompts", 3)             # the generator seed of iteration 3's prompts
"""

from __future__ import annotations

import hashlib

SEED_FORMAT = "spotlight-seed/2"
DOMAINS = {"request": 3, "candidate": 3, "prompts": 1, "minibatches": 1, "sde_window": 1, "init_noise": 2}
"""Domain name -> number of indices it takes."""


def domain_seed(run_seed: int, domain: str, *indices: int) -> int:
    """A 63-bit seed for `indices` in `domain`, never shared with another domain or other indices."""
    arity = DOMAINS.get(domain)
    if arity is None:
        raise ValueError(f"unknown seed domain {domain!r}; choose one of {sorted(DOMAINS)}")
    if len(indices) != arity:
        raise ValueError(f"seed domain {domain!r} takes {arity} indices, got {len(indices)}")
    for value in (run_seed, *indices):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"seed inputs must be integers, got {value!r}")
    if any(i < 0 for i in indices):
        raise ValueError(f"seed indices must be >= 0, got {indices}")
    text = ":".join([SEED_FORMAT, domain, str(run_seed), *map(str, indices)])
    digest = hashlib.blake2b(text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1)


def request_seed(seed: int, iteration: int, prompt_index: int, sample_index: int) -> int:
    """The default (unexplored) seed of one rollout request."""
    return domain_seed(seed, "request", iteration, prompt_index, sample_index)


def candidate_seeds(
    run_seed: int, iteration: int, prompt_index: int, group_size: int, num_candidates: int
) -> list[int]:
    """The M candidate seeds of one prompt: the G default request seeds first (so random seeds are always
    among those explored, and the monitor can still compare on them), then M - G more, deterministic."""
    if num_candidates < group_size:
        raise ValueError(f"num_candidates={num_candidates} must be >= group_size={group_size}")
    seeds = [request_seed(run_seed, iteration, prompt_index, j) for j in range(group_size)]
    extra = 0
    while len(seeds) < num_candidates:
        s = domain_seed(run_seed, "candidate", iteration, prompt_index, extra)
        extra += 1
        if s not in seeds:
            seeds.append(s)
    return seeds
