"""What a run saves loads in diffusers the standard way: a LoRA through the family pipeline's own
`load_lora_weights(folder)`, a full fine-tune through `from_pretrained(folder / "transformer")`, and either gives the
trained transformer's velocity back, not the base's."""

from __future__ import annotations

import pytest
import torch

from workers.model.families.diffusers_policy import load_model_policy, save_model_policy

PROMPT = "two red circles"


def _moved(policy) -> None:
    """Move every trainable weight off its start, as training would (B = 0 at a LoRA's start)."""
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))


def _velocity(policy, transformer) -> torch.Tensor:
    """`transformer`'s velocity at one fixed point, called the way the family's pipeline calls it."""
    cond, _ = policy.encode_prompts([PROMPT])
    x = torch.randn((1, *policy.latent_shape), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return policy.family.forward(
            transformer, x, policy.sigmas(4)[1].expand(1), cond.cond, policy.geometry, policy.model_spec
        )


@pytest.mark.parametrize("family", ["qwen-image", "sd3", "flux"])
def test_a_saved_lora_loads_with_the_pipelines_load_lora_weights_and_gives_the_trained_velocity(
    pipelines, family, tmp_path
):
    import diffusers

    policy = load_model_policy(pipelines[family], resolution=32, lora_rank=4, lora_alpha=8)  # scale 2: alpha travels
    _moved(policy)
    trained = _velocity(policy, policy.transformer)
    out = save_model_policy(policy, tmp_path / "policy")
    pipe = getattr(diffusers, policy.family.pipeline_class).from_pretrained(pipelines[family], local_files_only=True)
    base = _velocity(policy, pipe.transformer)
    pipe.load_lora_weights(out / "lora")
    loaded = _velocity(policy, pipe.transformer)
    torch.testing.assert_close(loaded, trained, rtol=1e-5, atol=1e-5)
    assert (loaded - base).abs().max() > 1e-2, "the loaded pipeline runs the base model"


@pytest.mark.parametrize("family", ["qwen-image", "sd3", "flux"])
def test_a_saved_full_fine_tune_loads_with_from_pretrained_and_gives_the_trained_velocity(pipelines, family, tmp_path):
    import diffusers

    policy = load_model_policy(pipelines[family], resolution=32, lora_rank=0)
    base = _velocity(policy, policy.transformer)
    _moved(policy)
    trained = _velocity(policy, policy.transformer)
    out = save_model_policy(policy, tmp_path / "policy")
    cls = getattr(diffusers, policy.family.transformer_class)
    loaded = _velocity(policy, cls.from_pretrained(out / "transformer", local_files_only=True))
    torch.testing.assert_close(loaded, trained, rtol=0, atol=0)
    assert (loaded - base).abs().max() > 1e-2
