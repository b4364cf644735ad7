"""Our sampler against each family's own diffusers pipeline `__call__`: the same initial latents and prompt give the
same latents (ODE, with the family's guidance) and, through the VAE, the same images. The tiny pipelines carry the
real models' published scheduler configs and latent normalisation, so a schedule or scaling bug shows here."""

from __future__ import annotations

import json

import pytest
import torch

from workers.algo.sampler import SamplerConfig, rollout
from workers.model.families.diffusers_policy import load_model_policy

PROMPT = "a blue square above a green triangle"
NUM_STEPS = 10  # the presets' train steps; SD3's old schedule was off by 0.24 at the last of 10 steps

PUBLISHED_SCHEDULERS = {
    # Qwen/Qwen-Image scheduler/scheduler_config.json
    "qwen-image": {
        "base_image_seq_len": 256,
        "base_shift": 0.5,
        "max_image_seq_len": 8192,
        "max_shift": 0.9,
        "num_train_timesteps": 1000,
        "shift": 1.0,
        "shift_terminal": 0.02,
        "time_shift_type": "exponential",
        "use_dynamic_shifting": True,
    },
    # stabilityai/stable-diffusion-3.5-medium scheduler/scheduler_config.json
    "sd3": {"num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": False},
    # black-forest-labs/FLUX.1-dev scheduler/scheduler_config.json
    "flux": {
        "base_image_seq_len": 256,
        "base_shift": 0.5,
        "max_image_seq_len": 4096,
        "max_shift": 1.15,
        "num_train_timesteps": 1000,
        "shift": 3.0,
        "use_dynamic_shifting": True,
    },
}

GUIDANCE = {"qwen-image": 4.0, "sd3": 4.5, "flux": 3.5}
"""Qwen-Image: true CFG with a norm rescale; SD3: standard CFG; FLUX.1-dev: the guidance embedding."""


def _pipeline_kwargs(family: str) -> dict:
    if family == "qwen-image":
        return {"negative_prompt": " ", "true_cfg_scale": GUIDANCE[family]}
    return {"guidance_scale": GUIDANCE[family]}  # SD3: the pipeline's own negative prompt ""


@pytest.mark.parametrize("family", ["qwen-image", "sd3", "flux"])
def test_the_tiny_pipelines_carry_the_published_scheduler_and_a_non_trivial_latent_normalisation(pipelines, family):
    config = json.loads((pipelines[family] / "scheduler" / "scheduler_config.json").read_text())
    assert {k: config.get(k) for k in PUBLISHED_SCHEDULERS[family]} == PUBLISHED_SCHEDULERS[family]
    vae = json.loads((pipelines[family] / "vae" / "config.json").read_text())
    if family == "qwen-image":
        assert len(set(vae["latents_mean"])) == vae["z_dim"] and min(vae["latents_std"]) > 1
    else:
        assert vae["scaling_factor"] != 1 and vae["shift_factor"] != 0


@pytest.mark.parametrize("family", ["qwen-image", "sd3", "flux"])
def test_the_ode_sampler_with_guidance_reproduces_the_familys_own_pipeline(pipelines, family):
    import diffusers

    policy = load_model_policy(pipelines[family], resolution=32, guidance=GUIDANCE[family])
    ours = rollout(policy, [PROMPT], [7], SamplerConfig(num_steps=NUM_STEPS, noise_level=0.0, forward_dtype="fp32"))
    pipe = getattr(diffusers, policy.family.pipeline_class).from_pretrained(pipelines[family], local_files_only=True)
    call = {"prompt": PROMPT, "height": 32, "width": 32, "num_inference_steps": NUM_STEPS, **_pipeline_kwargs(family)}
    theirs = pipe(latents=ours.latents[0].clone(), output_type="latent", **call).images
    # the pipeline's own schedule, as it set it for this call (SD3: set_timesteps(N); the others: their sigmas)
    torch.testing.assert_close(policy.sigmas(NUM_STEPS), pipe.scheduler.sigmas.float(), rtol=0, atol=0)
    torch.testing.assert_close(ours.images, theirs.float(), rtol=1e-4, atol=1e-4)
    # through the VAE with the family's latent normalisation: the pipeline's images in [0, 1]
    images = pipe(latents=ours.latents[0].clone(), output_type="pt", **call).images
    torch.testing.assert_close((policy.decode(ours.images) + 1) / 2, images.float(), rtol=1e-4, atol=1e-4)
