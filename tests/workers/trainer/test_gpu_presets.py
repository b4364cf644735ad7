"""The GPU presets (sd35m_lora, qwen_image_lora, flux1_lora) build and validate with the GPU memory settings (their
recipes' values: test_recipe_presets.py), and a run on a pipeline folder of their family accepts them at load, with
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
def test_gpu_presets_train_flow_grpo_in_bf16_within_the_gpu_memory_settings(name):
    config = get_preset(name)  # TrainConfig validates in __post_init__; the recipe's values: test_recipe_presets.py
    assert config.grpo.objective == "flow_grpo" and config.sampler.forward_dtype == "bf16"
    assert config.reward == NO_REWARD  # a run names its own (--reward)
    assert (config.rollout_batch, config.micro_batch, preset_config(name).train.gradient_checkpointing) == (8, 8, True)
    model = preset_config(name).model
    assert (model.resolution, model.base_dtype) == (512, "bf16")


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
