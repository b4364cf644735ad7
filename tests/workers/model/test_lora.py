"""The LoRA on a diffusers transformer (workers/model/families/lora.py): where it starts."""

from __future__ import annotations

import torch

from workers.model.families.policy import load_model_policy


def test_a_lora_starts_from_the_same_adapter_whatever_the_processs_random_state(pipelines):
    """Regression: lora_A was drawn from the global RNG, so `spotlight train --nproc 2` (whose rank 0 had drawn
    other numbers first) started from another adapter than `--nproc 1`, and their updates differed."""
    loaded = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        before = torch.random.get_rng_state()
        loaded.append(load_model_policy(pipelines["qwen-image"], resolution=32, lora_rank=4).weights())
        assert torch.equal(torch.random.get_rng_state(), before), "building the LoRA moved the caller's RNG"
    assert any(float(v.abs().sum()) > 0 for k, v in loaded[0].items() if "lora_A" in k)
    torch.testing.assert_close(loaded[0], loaded[1], atol=0, rtol=0)
