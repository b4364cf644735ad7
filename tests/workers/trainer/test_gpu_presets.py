"""The GPU presets (sd35m_lora, qwen_image_lora, flux1_lora) build, validate and carry the settings docs/MODELS.md
quotes (Flow-GRPO's published recipes), and a run on a pipeline folder of their family accepts them at load, with
the preset's model defaults and the command line's overrides. Construction only: nothing here samples or trains."""

from __future__ import annotations

import dataclasses

import pytest

from resources.settings.resolve import flag_layer, resolve
from workers.trainer.grpo_trainer import NO_REWARD
from workers.trainer.presets import PRESETS, get_preset, preset_config

GPU_PRESETS = {"sd35m_lora": "sd3", "qwen_image_lora": "qwen-image", "flux1_lora": "flux"}


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    """family -> the folder of a tiny random-init pipeline of it."""
    from workers.model.families.tiny import build_tiny_pipeline

    root = tmp_path_factory.mktemp("pipelines")
    return {f: build_tiny_pipeline(f, root / f) for f in set(GPU_PRESETS.values())}


@pytest.mark.parametrize("name", sorted(GPU_PRESETS))
def test_gpu_presets_carry_flow_grpos_published_settings(name):
    config = get_preset(name)  # TrainConfig validates in __post_init__
    # docs/MODELS.md: 10 steps, clip 1e-4, advantage clip 5, KL beta 0.04, LoRA at lr 3e-4, bf16 forward.
    assert config.sampler.num_steps == 10 and config.sampler.forward_dtype == "bf16"
    grpo = config.grpo
    assert (grpo.objective, grpo.clip_range, grpo.adv_clip, grpo.kl_beta, grpo.lr) == (
        "flow_grpo",
        1e-4,
        5.0,
        0.04,
        3e-4,
    )
    assert grpo.kl_form == "flow_grpo"  # beta 0.04 weighs what it weighed in flow_grpo (docs/MODELS.md, the KL term)
    assert config.reward == NO_REWARD and config.prompts_per_iteration == 16  # a run names its own (--reward)
    assert (config.rollout_batch, config.micro_batch, preset_config(name).train.gradient_checkpointing) == (8, 8, True)
    if name == "qwen_image_lora":  # groups of 16, noise level 1.2 on a 2-step SDE window
        assert (config.group_size, config.sampler.noise_level, config.sampler.sde_window) == (16, 1.2, (0, 2))
        assert len(config.sampler.sde_steps) == 2
    else:  # SD3.5-M's (reused, unverified, by FLUX.1): groups of 24, noise level 0.7 on every step
        assert (config.group_size, config.sampler.noise_level, config.sampler.sde_window) == (24, 0.7, None)
        assert len(config.sampler.sde_steps) == 10
    # Each preset's own model defaults: 512 px, bf16 base, its LoRA rank and guidance.
    rank, guidance = {"sd35m_lora": (32, 4.5), "qwen_image_lora": (64, 4.5), "flux1_lora": (32, 3.5)}[name]
    model = preset_config(name).model
    assert (model.resolution, model.lora_rank, model.guidance, model.base_dtype) == (512, rank, guidance, "bf16")


@pytest.mark.parametrize("name", sorted(GPU_PRESETS))
def test_gpu_preset_batches_split_over_the_eight_gpus_the_docs_launch(name):
    from workers.trainer.fsdp import check_batch_split

    config = get_preset(name)
    # docs/PIPELINE.md: `spotlight run --model ... --preset qwen_image_lora --device cuda --nproc 8`
    check_batch_split(config.prompts_per_iteration * config.group_size, config.grpo.num_minibatches, 8)


def _run(**flags):
    from assets.run_config import RunConfigResource

    return RunConfigResource.of(resolve([flag_layer(flags)], PRESETS).config)


@pytest.mark.parametrize("name", sorted(GPU_PRESETS))
def test_a_run_on_a_pipeline_of_the_presets_family_loads_with_its_model_defaults(pipelines, name):
    folder = str(pipelines[GPU_PRESETS[name]])
    with pytest.raises(ValueError, match="names no reward: pass --reward"):
        _run(preset=name, model=folder)
    reward = "jpeg_compressibility"
    resource = _run(preset=name, model=folder, reward=reward)  # validates folder and geometry
    model = preset_config(name).model
    fields = resource.settings.model_fields
    assert (fields["resolution"], fields["lora_rank"], fields["guidance"], fields["base_dtype"]) == (
        model.resolution,
        model.lora_rank,
        model.guidance,
        "bf16",
    )
    assert resource.train == dataclasses.replace(get_preset(name), reward=reward)
    overridden = _run(preset=name, model=folder, reward=reward, lora_rank=8, resolution=256, guidance=2.0)
    assert {k: overridden.settings.model_fields[k] for k in ("lora_rank", "resolution", "guidance", "base_dtype")} == {
        "lora_rank": 8,
        "resolution": 256,
        "guidance": 2.0,
        "base_dtype": "bf16",
    }
    with pytest.raises(ValueError, match="resolution 513 must be a multiple of"):
        _run(preset=name, model=folder, reward=reward, resolution=513)  # not a multiple of the VAE x packing stride
