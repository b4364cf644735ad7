"""Exploration's cache hooks on a diffusers pipeline with true CFG: one cache per guidance branch."""

from __future__ import annotations

import math

import pytest
import torch

from workers.algo.sampler import SamplerConfig
from workers.explore.request import ExploreSpec, explore_rewards
from workers.model.families.diffusers_policy import load_model_policy


@pytest.mark.parametrize("level", ["fbcache", "taylorseer"])
def test_a_cache_hook_explores_a_true_cfg_pipeline_with_a_cache_per_branch(pipelines, level) -> None:
    """The conditional and unconditional passes differ in text length: sharing one cache context made the
    unconditional pass reuse the conditional one's residuals (a shape error on tiny Qwen-Image)."""
    torch.manual_seed(0)
    policy = load_model_policy(pipelines["qwen-image"], resolution=32, guidance=3.0)
    sampler = SamplerConfig(num_steps=4, noise_level=0.0, forward_dtype="fp32")
    spec = ExploreSpec("demo", "two red circles", (1, 2, 3, 4), 0, sampler, level, reward="jpeg_compressibility")
    first = explore_rewards(policy, spec)
    assert len(first) == 4 and all(math.isfinite(r) for r in first)
    assert explore_rewards(policy, spec) == first  # the hook leaves nothing behind between requests
    assert not policy.transformer.is_cache_enabled
