"""The memory plan (workers/trainer/memory_plan.py): the parts counted on the meta device are the parts diffusers and
transformers load; the published Qwen-Image counts as its 20B; a run that cannot fit is refused, by `spotlight
config --memory` and by `spotlight train` before any weights load, naming the knob to turn."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from resources.settings.config import RunConfig
from workers.trainer.presets import preset_config


@pytest.fixture(scope="module")
def qwen_configs(tmp_path_factory):
    """Qwen-Image's published architecture as config.json files only (no weights)."""
    from workers.model.families.config_folder import write_qwen_image_configs

    return write_qwen_image_configs(tmp_path_factory.mktemp("qwen-configs") / "qwen")


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    from workers.model.families.tiny import build_tiny_pipeline

    return build_tiny_pipeline("qwen-image", tmp_path_factory.mktemp("tiny") / "qwen")


def _config(folder, **changes) -> RunConfig:
    base = preset_config("qwen_image_lora").model_dump()
    base["model"]["model"] = str(folder)
    for section, values in changes.items():
        base[section].update(values)
    return RunConfig.model_validate(base)


def test_sizes_counted_on_meta_equal_the_loaded_parts(tiny_qwen):
    from workers.model.families.diffusers_policy import load_model_policy
    from workers.trainer.model_sizes import model_sizes

    sizes = model_sizes(tiny_qwen, lora_rank=4)
    policy = load_model_policy(tiny_qwen, lora_rank=4, resolution=32)
    base = sum(p.numel() for n, p in policy.transformer.named_parameters() if ".lora_" not in n)
    lora = sum(p.numel() for n, p in policy.transformer.named_parameters() if ".lora_" in n)
    encoder = sum(p.numel() for p in policy.frozen.text_pipe.text_encoder.parameters())
    assert (sizes.transformer_params, sizes.lora_params) == (base, lora)  # peft's own adapter, as add_lora adds it
    assert sizes.text_encoder_params == encoder
    assert sizes.vae_params == sum(p.numel() for p in policy.frozen.vae.parameters())
    assert sizes.num_blocks == len(policy.transformer.transformer_blocks)


def test_the_published_qwen_image_counts_20b_and_its_text_encoder_8b(qwen_configs):
    from workers.trainer.model_sizes import model_sizes

    sizes = model_sizes(qwen_configs, lora_rank=64)
    assert 20.0e9 < sizes.transformer_params < 20.6e9  # "a 20B MMDiT" (the Qwen-Image report)
    assert 8.0e9 < sizes.text_encoder_params < 8.5e9  # Qwen2.5-VL-7B: 8.3B with its vision tower
    assert (sizes.num_blocks, sizes.hidden_size) == (60, 3072)


def test_the_qwen_lora_preset_fits_80_gb_and_full_fine_tuning_does_not(qwen_configs):
    from workers.trainer.memory_plan import MemoryPlanError, check_fits, plan_memory
    from workers.trainer.model_sizes import model_sizes

    lora = plan_memory(_config(qwen_configs), model_sizes(qwen_configs, 64), gpu_GB=80)
    check_fits(lora)
    full = plan_memory(_config(qwen_configs, model={"lora_rank": 0}), model_sizes(qwen_configs, 0), gpu_GB=80)
    with pytest.raises(MemoryPlanError, match="LoRA"):
        check_fits(full)


def test_checkpointing_keeps_one_block_of_activations_and_the_refusal_names_it(qwen_configs):
    from workers.trainer.memory_plan import MemoryPlanError, check_fits, plan_memory
    from workers.trainer.model_sizes import model_sizes

    sizes = model_sizes(qwen_configs, 64)
    on = plan_memory(_config(qwen_configs), sizes, gpu_GB=80)
    off = plan_memory(_config(qwen_configs, train={"gradient_checkpointing": False}), sizes, gpu_GB=80)
    key = "activations of one micro-batch"
    assert off.components[key] > 5 * on.components[key]
    assert off.peak_phase == "update" and not off.fits
    with pytest.raises(MemoryPlanError, match="gradient_checkpointing"):
        check_fits(off)


def test_spotlight_config_memory_prints_the_plan_and_fails_what_cannot_fit(qwen_configs):
    from pipelines.cli import app

    args = ["config", "--preset", "qwen_image_lora", "--model", str(qwen_configs), "--memory", "80"]
    fits = CliRunner().invoke(app, args)
    assert fits.exit_code == 0, fits.output
    assert "transformer base" in fits.output and re.search(r"GPU 80 GB .*: fits", fits.output)
    refused = CliRunner().invoke(app, [*args, "--lora-rank", "0"])
    assert refused.exit_code == 1 and "does NOT fit" in refused.output


def test_spotlight_train_refuses_a_run_too_big_for_its_gpu_before_loading_weights(qwen_configs, tmp_path):
    from pipelines.cli import app

    out = tmp_path / "run"
    done = CliRunner().invoke(
        app,
        [
            "train",
            "--preset",
            "qwen_image_lora",
            "--model",
            str(qwen_configs),  # config.json files only: a weight load would fail on another error
            "--reward",
            "jpeg_compressibility",
            "--lora-rank",
            "0",
            "--gpu-memory-gb",
            "80",
            "--out",
            str(out),
        ],
    )
    said = re.sub(r"[\s│]+", " ", done.output)
    assert done.exit_code != 0 and "needs about" in said and "--lora-rank 64" in said, said
    assert not out.exists()


def test_one_process_full_fine_tuning_counts_its_masters_once_and_sampling_holds_no_adamw(qwen_configs):
    from workers.trainer.memory_plan import GB, plan_memory
    from workers.trainer.model_sizes import model_sizes

    sizes = model_sizes(qwen_configs, 0)
    alone = plan_memory(_config(qwen_configs, model={"lora_rank": 0}, train={"nproc": 1}), sizes, gpu_GB=None)
    weights_and_state = alone.phase_GB("update") - alone.components["activations of one micro-batch"]
    # the resident policy trains in place: FP32 masters, gradients and AdamW, 16 bytes a parameter, not 20
    assert weights_and_state == pytest.approx(sizes.transformer_params * 16 / GB)
    lora = plan_memory(_config(qwen_configs), model_sizes(qwen_configs, 64), gpu_GB=None)
    assert not any("AdamW" in k for k in lora.phases["sample"]), "the trainer's state is freed before sampling"
    assert any("AdamW" in k for k in lora.phases["update"])


def test_one_process_with_train_ema_plans_the_ema_beside_the_weights_it_averages(qwen_configs):
    from workers.trainer.memory_plan import GB, plan_memory
    from workers.trainer.model_sizes import model_sizes

    sizes = model_sizes(qwen_configs, 0)
    config = _config(qwen_configs, model={"lora_rank": 0}, train={"nproc": 1, "ema": False})
    without = plan_memory(config, sizes, gpu_GB=None)
    config = _config(qwen_configs, model={"lora_rank": 0}, train={"nproc": 1, "ema": True})
    with_ema = plan_memory(config, sizes, gpu_GB=None)
    # workers/trainer/ema_weights.py: alone, an FP32 clone of the trained weights on the trainer's device
    assert with_ema.phase_GB("update") - without.phase_GB("update") == pytest.approx(sizes.transformer_params * 4 / GB)
