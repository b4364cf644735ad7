"""Seed exploration on stale weights: score M candidate seeds of a prompt with a cheap sampler,
pick the G that contrast most.

While the trainer turns weights v(k) into v(k+1), spot workers sample the prompts of
iteration k+1 on v(k) with a cheap sampler level: fewer denoising steps and/or a diffusers
cache hook on the QwenImage transformer (`enable_cache` with FirstBlockCache or
TaylorSeer). An exploration request is one prompt with its M candidate seeds, sampled
as one batch (so its result does not depend on what else a worker holds) and scored by
the run's reward. The coordinator then keeps, per prompt, the G seeds whose explored
rewards have the largest variance (`select_max_variance`): GRPO learns only from groups
whose rewards differ.

Example:
    spec = ExploreSpec("demo", prompt, tuple(candidate_seeds(0, 5, 2, 8, 16)), 4, sampler, "half_steps")
    rewards = explore_rewards(policy, spec)                 # M floats, deterministic
    seeds = select_max_variance(spec.seeds, rewards, 8)     # the group for the real rollout
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from resources.keys import explore_result_key
from workers.algo.sampler import SamplerConfig, rollout
from workers.task.prompt_row import fields_negative, set_row_negatives
from workers.task.render import decode_images
from workers.task.request_fields import check_policy_reads, check_prompt_fields, check_request_fields
from workers.task.reward_inputs import call_reward
from workers.task.rewards import get_reward

EXPLORE_FORMAT = "spotlight-explore-result/1"
RESULT_NAME = "explore.json"
_PAYLOAD_FIELDS = {"run", "prompt", "seeds", "weights_version", "sampler", "cache_level", "reward"}


@dataclass(frozen=True)
class CacheLevel:
    """A cheap-sampler setting: a share of the rollout's denoising steps, optionally a diffusers cache hook."""

    name: str
    step_fraction: float
    """Share of the rollout sampler's steps kept (at least one)."""
    hook: str | None
    """None, "fbcache" (FirstBlockCache) or "taylorseer" (TaylorSeer)."""
    nominal_cost: float
    """Cost of one sample relative to the full sampler, measured on the shipped base (a prior for the bandit)."""

    def sampler(self, rollout: SamplerConfig) -> SamplerConfig:
        """The cheap sampler derived from the rollout's: same noise level, fewer steps, the SDE window scaled."""
        steps = max(1, round(rollout.num_steps * self.step_fraction))
        window = rollout.sde_window
        if window is not None and steps != rollout.num_steps:
            start = min(int(window[0] * self.step_fraction), steps - 1)
            window = (start, min(steps, max(start + 1, round(window[1] * self.step_fraction))))
        return dataclasses.replace(rollout, num_steps=steps, sde_window=window)

    def cache_config(self):
        """The diffusers cache config of the hook (None without one). Thresholds: docs/EXPLORATION.md."""
        if self.hook == "fbcache":
            from diffusers import FirstBlockCacheConfig

            return FirstBlockCacheConfig(threshold=0.3)
        if self.hook == "taylorseer":
            from diffusers import TaylorSeerCacheConfig

            return TaylorSeerCacheConfig(cache_interval=3, disable_cache_before_step=2)
        return None


CACHE_LEVELS: dict[str, CacheLevel] = {
    level.name: level
    for level in (
        CacheLevel("none", 1.0, None, 1.0),
        CacheLevel("fbcache", 1.0, "fbcache", 0.8),
        CacheLevel("taylorseer", 1.0, "taylorseer", 0.8),
        CacheLevel("half_steps", 0.5, None, 0.5),
        CacheLevel("quarter_steps", 0.25, None, 0.25),
    )
}
"""Named cheap-sampler levels; nominal costs from docs/EXPLORATION.md's measurement (8-step ODE, 16 seeds)."""


def cache_level(name: str) -> CacheLevel:
    if name not in CACHE_LEVELS:
        raise ValueError(f"unknown cache level {name!r}; choose one of {sorted(CACHE_LEVELS)}")
    return CACHE_LEVELS[name]


@dataclass(frozen=True)
class ExploreSpec:
    """One exploration request: deterministic given these fields and the weights of `weights_version`."""

    run: str
    prompt: str
    seeds: tuple[int, ...]
    """The prompt's candidate seeds (M)."""
    weights_version: int
    """Stale weights: the version the trainer is updating while this is explored."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    """The rollout's sampler; `cache_level` derives the cheap one from it."""
    cache_level: str = "half_steps"
    reward: str = "minigeneval"
    prompt_fields: dict[str, Any] | None = None
    """The prompt's other fields from the run's prompts file, for a reward that takes them (absent: None)."""

    def __post_init__(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"explore request: seeds must be distinct and non-empty, got {list(self.seeds)[:5]}")
        for seed in self.seeds:
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
                raise ValueError(f"explore request: seeds must be ints in [0, 2**63), got {seed!r}")
        check_request_fields(self.run, self.prompt, self.weights_version, self.reward)
        check_prompt_fields(self.prompt_fields)
        cache_level(self.cache_level)

    @property
    def cheap_sampler(self) -> SamplerConfig:
        return cache_level(self.cache_level).sampler(self.sampler)

    def to_payload(self) -> dict[str, Any]:
        sampler = dataclasses.asdict(self.sampler)
        if sampler["sde_window"] is not None:
            sampler["sde_window"] = list(sampler["sde_window"])
        payload = {
            "run": self.run,
            "prompt": self.prompt,
            "seeds": list(self.seeds),
            "weights_version": self.weights_version,
            "sampler": sampler,
            "cache_level": self.cache_level,
            "reward": self.reward,
        }
        if self.prompt_fields is not None:  # absent otherwise: the payload and fingerprint are what they were
            payload["prompt_fields"] = self.prompt_fields
        return payload

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> "ExploreSpec":
        """Parse a queue payload; ValueError names what is missing or wrong."""
        if not isinstance(payload, Mapping):
            raise ValueError(f"an explore payload must be a dict, got {type(payload).__name__}")
        missing = sorted(_PAYLOAD_FIELDS - set(payload))
        extra = sorted(set(payload) - _PAYLOAD_FIELDS - {"prompt_fields"})
        if missing or extra:
            raise ValueError(f"explore payload: missing fields {missing}, unknown fields {extra}")
        config = SamplerConfig.from_json(payload["sampler"], "explore payload")
        if not isinstance(payload["seeds"], list):
            raise ValueError("explore payload: seeds must be a list")
        return cls(
            payload["run"],
            payload["prompt"],
            tuple(payload["seeds"]),
            payload["weights_version"],
            config,
            payload["cache_level"],
            payload["reward"],
            payload.get("prompt_fields"),
        )

    @property
    def fingerprint(self) -> str:
        text = json.dumps(self.to_payload(), sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _forget_child_registries(transformer) -> None:
    # diffusers 0.39 caches the list of child hook registries on first use; after one cache
    # is disabled and another enabled, the stale list misses the new hooks ("No context is set").
    from diffusers.hooks import HookRegistry

    HookRegistry.check_if_exists_or_initialize(transformer)._child_registries_cache = None


@contextlib.contextmanager
def cache_hooks(transformer, level: CacheLevel) -> Iterator[None]:
    """The level's cache hook on the transformer for one sampling run, removed afterwards (a rollout
    on the same worker never sees it). Hooks are enabled before the cache context, as diffusers requires."""
    config = level.cache_config()
    if config is None:
        yield
        return
    if level.hook == "fbcache" and len(getattr(transformer, "transformer_blocks", ())) < 2:
        raise ValueError(
            f"cache level {level.name!r} needs a transformer with at least 2 blocks (FirstBlockCache "
            "skips the blocks after the first); choose another level for this model"
        )
    transformer.enable_cache(config)
    _forget_child_registries(transformer)
    try:
        transformer._reset_stateful_cache()
        with transformer.cache_context("explore"):
            yield
    finally:
        transformer.disable_cache()
        _forget_child_registries(transformer)


def explore_rewards(policy, spec: ExploreSpec, chunk: int | None = None) -> list[float]:
    """Sample the request's candidate seeds with the cheap sampler, `chunk` at a time (None: as one batch), and
    score them. Each chunk runs in a cache context of its own: a cache hook's state never crosses chunks."""
    import numpy as np

    level = cache_level(spec.cache_level)
    set_row_negatives(policy, fields_negative(spec.prompt, spec.prompt_fields))
    seeds = list(spec.seeds)
    size = chunk or len(seeds)
    images = []
    for start in range(0, len(seeds), size):
        part = seeds[start : start + size]
        with cache_hooks(policy.transformer, level):
            traj = rollout(policy, [spec.prompt] * len(part), part, level.sampler(spec.sampler))
        images.append(decode_images(policy, traj.images))
    prompts = [spec.prompt] * len(seeds)
    fields = None if spec.prompt_fields is None else [spec.prompt_fields] * len(prompts)
    return [float(r) for r in call_reward(get_reward(spec.reward), np.concatenate(images), prompts, fields)]


@dataclass
class ExploreOutcome:
    """What one exploration request produced on a worker."""

    request_id: str
    status: str
    """done, or already_done (an earlier attempt committed the result)."""
    result_key: str
    rewards: list[float]
    compute_s: float = 0.0


def work_explore_request(
    request,
    store,
    holder,
    *,
    worker_id: str,
    attempt: int = 1,
    report: Callable[..., None] = lambda event, **fields: None,
) -> ExploreOutcome:
    """A rollout worker's handling of an `explore` request: policy at the stale version, cheap sampling,
    the rewards committed exclusively at `explore_result_key`. ValueError for a malformed payload."""
    spec = ExploreSpec.from_payload(request.payload)
    key = explore_result_key(spec.run, request.iteration, request.request_id)
    done = store.read_manifest(key)
    if done is not None:
        return ExploreOutcome(request.request_id, "already_done", key, list(done.metadata.get("rewards", [])))

    holder.check_forward(spec.cheap_sampler)  # BF16-resident weights run BF16 forwards only: refused before loading
    policy = holder.policy_at(spec.run, spec.weights_version)
    check_policy_reads(policy, spec.prompt)  # the pixel policy reads MiniGenEval's words only: refused before sampling
    report("claim", request_id=request.request_id, kind="explore", attempt=attempt, resumed_from_step=0)
    started = time.perf_counter()
    rewards = explore_rewards(policy, spec)
    compute_s = time.perf_counter() - started
    commit_explore_result(store, key, spec, rewards, compute_s=compute_s, worker_id=worker_id, attempt=attempt)
    report("done", request_id=request.request_id, kind="explore", result_key=key, compute_s=compute_s)
    return ExploreOutcome(request.request_id, "done", key, rewards, compute_s)


def commit_explore_result(
    store, key: str, spec: ExploreSpec, rewards: list[float], *, compute_s: float, worker_id: str, attempt: int = 1
) -> None:
    """Commit a request's explored rewards at `key`, exclusively (a second attempt's commit loses, harmlessly).
    `compute_s` is what the explorer spent, in its budget's unit (worker-seconds, or samples in process)."""
    body = {"seeds": list(spec.seeds), "rewards": rewards}
    meta = {
        "format": EXPLORE_FORMAT,
        "fingerprint": spec.fingerprint,
        "prompt": spec.prompt,
        "seeds": list(spec.seeds),
        "rewards": rewards,
        "cache_level": spec.cache_level,
        "weights_version": spec.weights_version,
        "worker_id": worker_id,
        "attempt": attempt,
        "compute_s": compute_s,
        "finished_at": time.time(),
    }
    store.publish(key, {RESULT_NAME: json.dumps(body).encode()}, meta, exclusive=True)
