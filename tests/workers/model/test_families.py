"""Diffusers pipelines as policies: tiny random-init Qwen-Image, SD3 and FLUX.1 pipelines, saved and loaded back
through the path a user's checkpoint takes (no download)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from workers.algo.sampler import SamplerConfig, rollout
from workers.model.families.diffusers_policy import load_model_policy
from workers.model.families.identify import UnsupportedModelError, detect_family
from workers.model.policy_loader import build_from_spec, load_any

FAMILIES = ("qwen-image", "sd3", "flux")
PROMPTS = ["two red circles", "a blue square above a green triangle"]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_pipeline_loads_as_a_policy_whose_lora_starts_at_the_base(pipelines, family):
    full = load_model_policy(pipelines[family], resolution=32, lora_rank=0)
    lora = load_model_policy(pipelines[family], resolution=32, lora_rank=4)
    assert detect_family(pipelines[family]) == family
    # LoRA: only the adapter trains and syncs; it is a small share of the transformer.
    assert all(".lora_" in k for k in lora.weights())
    n_lora = sum(p.numel() for p in lora.trainable_parameters())
    n_full = sum(p.numel() for p in full.trainable_parameters())
    assert 0 < n_lora < n_full / 5
    cond, mask = full.encode_prompts(PROMPTS)
    x = torch.randn(2, *full.latent_shape)
    sigma = full.sigmas(4)[1].expand(2)
    with torch.no_grad():
        v_full, v_lora = full.velocity(x, sigma, cond, mask), lora.velocity(x, sigma, *lora.encode_prompts(PROMPTS))
    assert v_full.shape == x.shape
    torch.testing.assert_close(v_lora, v_full)  # B = 0 at init: the LoRA policy is the base
    images = full.decode(x)
    assert images.shape == (2, 3, 32, 32) and images.min() >= -1 and images.max() <= 1


@pytest.mark.parametrize("family", FAMILIES)
def test_a_policy_rebuilt_from_its_spec_and_weights_samples_bit_identically(pipelines, family):
    policy = load_model_policy(pipelines[family], resolution=32, lora_rank=4)
    with torch.no_grad():  # move the adapter off its init so a lost weight would show
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    config = SamplerConfig(num_steps=4, noise_level=0.7, forward_dtype="fp32")
    whole = rollout(policy, PROMPTS, [3, 4], config)
    again = build_from_spec(json.loads(json.dumps(policy.spec())))
    again.load_weights({k: v.clone() for k, v in policy.weights().items()})
    replay = rollout(again, PROMPTS, [3, 4], config)
    half = rollout(again, PROMPTS, [3, 4], config, stop_at=2)
    resumed = rollout(again, PROMPTS, [3, 4], config, resume=half.state())
    assert torch.equal(replay.latents, whole.latents) and torch.equal(replay.log_probs, whole.log_probs)
    assert torch.equal(resumed.images, whole.images) and torch.equal(resumed.log_probs, whole.log_probs)
    assert not torch.equal(rollout(policy, PROMPTS, [3, 5], config).images[1], whole.images[1])


def test_pulse_ships_the_lora_adapter_losslessly(pipelines, tmp_path):
    from resources.store import open_store
    from workers.pulse.weights_hash import weights_hash
    from workers.rollout.weights import PolicyHolder, publish_policy
    from workers.trainer.checkpoint import bf16_weights

    policy = load_model_policy(pipelines["qwen-image"], resolution=32, lora_rank=4)
    store = open_store(str(tmp_path / "store"))
    publisher = publish_policy(store, "lora", policy)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(1e-2 * torch.randn_like(p))
    publisher.publish(1, bf16_weights(policy))
    received = PolicyHolder(store).policy_at("lora", 1)
    assert set(received.weights()) == set(policy.weights())
    assert weights_hash({k: v.to(torch.bfloat16) for k, v in received.weights().items()}) == weights_hash(
        bf16_weights(policy)
    )


def test_folders_that_are_not_supported_pipelines_are_refused_before_any_weights_load(tmp_path):
    (tmp_path / "sd15").mkdir()
    (tmp_path / "sd15" / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    with pytest.raises(UnsupportedModelError, match="StableDiffusionPipeline.*QwenImagePipeline"):
        load_any(tmp_path / "sd15", lora_rank=8)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnsupportedModelError, match="no model_index.json"):
        load_any(tmp_path / "empty", lora_rank=8)
    with pytest.raises(UnsupportedModelError, match="no such folder"):
        detect_family(tmp_path / "missing")


def test_a_resolution_the_family_cannot_pack_is_refused(pipelines):
    with pytest.raises(ValueError, match="multiple of"):
        load_model_policy(pipelines["qwen-image"], resolution=30)


def test_rewards_score_the_vae_decoded_images(pipelines):
    from workers.task.render import decode_images

    policy = load_model_policy(pipelines["sd3"], resolution=32)
    images = decode_images(policy, torch.randn(3, *policy.latent_shape))
    assert images.shape == (3, 32, 32, 3) and images.dtype == np.uint8


def test_the_gpu_checks_code_path_runs_at_toy_size_and_pulse_is_lossless(tmp_path):
    from workers.bench.model_check import run_model_check

    figures = run_model_check(
        device="cpu", widths="tiny", resolution=32, batch_size=8, num_steps=2, lora_rank=4, workdir=str(tmp_path)
    )
    for mode in ("lora", "full"):
        assert figures[mode]["samples_per_s"] > 0 and figures[mode]["grpo_update_s"] > 0
        assert 0 <= figures[mode]["off_device_share"] < 1
        assert figures[mode]["pulse"]["lossless"]
        assert figures[mode]["first_ratio_dev"] == {"rollout_vs_train": 0.0, "recomputed": 0.0}  # on the CPU
    assert figures["lora"]["trainable_params_M"] < figures["full"]["trainable_params_M"]
    assert figures["lora"]["memory_fit"]["peak_60_blocks_GB"] is None  # no device peak on the CPU
    assert figures["vae_decode"]["two_chunks_s"] > 0
    assert figures["fsdp_update"]["optimizer_steps"] > 0 and figures["fsdp_update"]["grad_norm"] > 0
    assert set(figures["load"]) == {"load_s_low_cpu_mem_usage_false", "load_s_low_cpu_mem_usage_true", "build_empty_s"}
    presets = {p["preset"]: p for p in figures["presets"]}
    assert set(presets) == {"qwen_image_lora", "sd35m_lora", "flux1_lora"}  # each family's preset, its own update
    for p in presets.values():
        assert p["optimizer_steps"] == 1 and p["grad_norm"] > 0 and p["gradient_checkpointing"]
        assert p["measured_GB"] >= 0 and p["planned_GB"] > 0
    assert presets["qwen_image_lora"]["guidance"] > 1 and presets["flux1_lora"]["guidance"] == 3.5


def test_the_memory_fit_extrapolates_the_block_and_batch_slopes():
    from workers.bench.model_check_memory import TEXT_ENCODER_GB, fit_memory

    fit = fit_memory({(1, 8): 20.0, (2, 8): 21.0, (1, 16): 24.0}, batch=8)
    assert fit["per_block_GB"] == 1.0 and fit["per_sample_GB"] == 0.5
    assert fit["peak_60_blocks_GB"] == 20.0 + 59 * 1.0
    assert fit["with_text_encoder_GB"] == round(79.0 + TEXT_ENCODER_GB, 2)
