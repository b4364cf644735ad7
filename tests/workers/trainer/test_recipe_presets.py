"""Each recipe preset holds the values of the config it cites; a preset that drifts from its recipe fails here.

The table below is read from the cited sources (the presets' module docstring names them):
- flow_grpo, yifan123/flow_grpo at commit 54809b5: config/grpo.py (`geneval_sd3`, `general_ocr_sd3`,
  `pickscore_sd3`, `pickscore_qwenimage`, `pickscore_flux`) over config/base.py; LoRA r=32 / alpha 64, the EMA's
  decay 0.9 every 8 steps and the trained steps int(num_steps x timestep_fraction) from scripts/train_sd3.py.
  Prompts per iteration = num_batches_per_epoch x train_batch_size x 32 GPUs / num_image_per_prompt; optimizer
  steps per iteration = num_batches_per_epoch / gradient_accumulation_steps = 2.
- DanceGRPO, XueZeyue/DanceGRPO at 22b85ef: scripts/finetune/finetune_flux_grpo.sh (2 nodes x 8 GPUs, one prompt
  and 12 generations per GPU, accumulation 4) and fastvideo/train_grpo_flux.py (guidance 3.5, no KL).
None = not set by the recipe here (a run names it: the reward, for one).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from workers.trainer.presets import PRESETS, RECIPE_PRESETS, get_preset, preset_config

_SD35M = dict(
    resolution=512,
    lora=(32, 64.0),
    guidance=4.5,
    eval_guidance=4.5,
    num_steps=10,
    validation_steps=40,
    noise_level=0.7,
    trained_steps=9,
    random_window=None,
    group_size=24,
    prompts_per_iteration=48,
    minibatches=2,
    epochs=1,
    lr=3e-4,
    weight_decay=1e-4,
    clip_range=1e-4,
    adv_clip=5.0,
    adv_norm="global_std",
    kl_beta=0.04,
    ema=(0.9, 8),
    init_same_noise=False,
    reward="",
    seed=42,
)
RECIPES = {
    "sd35m_geneval": _SD35M,  # geneval_sd3
    "sd35m_ocr": {**_SD35M, "reward": "ocr"},  # general_ocr_sd3 (flow_grpo's OCR formula: rewards_ocr.py)
    "sd35m_pickscore": {**_SD35M, "kl_beta": 0.01},  # pickscore_sd3: train.beta 0.01
    "qwen_image_pickscore": {  # pickscore_qwenimage
        **_SD35M,
        "lora": (64, None),  # not in its config: this project's choice
        "guidance": 4.0,
        "validation_steps": 50,
        "noise_level": 1.2,
        "trained_steps": 2,
        "random_window": (2, (0, 5)),  # sde_window_size 2, sde_window_range (0, num_steps // 2)
        "group_size": 16,
        "prompts_per_iteration": 32,
        "kl_beta": 0.0,
        "ema": None,
    },
    "flux1_flow_grpo": {  # pickscore_flux
        **_SD35M,
        "guidance": 3.5,
        "num_steps": 6,
        "validation_steps": 28,
        "noise_level": 0.9,
        "trained_steps": 5,
        "kl_beta": 0.0,
    },
    "flux1_dancegrpo": {  # finetune_flux_grpo.sh
        **_SD35M,
        "resolution": 720,
        "lora": (0, None),  # full fine-tuning
        "guidance": 3.5,
        "eval_guidance": 3.5,
        "num_steps": 16,
        "validation_steps": 16,
        "noise_level": 0.3,  # --eta 0.3 (DanceGRPO's own SDE: not the same noise, see the preset)
        "trained_steps": 15,  # --ignore_last
        "group_size": 12,
        "prompts_per_iteration": 16,
        "minibatches": 3,
        "lr": 1e-5,
        "adv_norm": "group",
        "kl_beta": 0.0,
        "ema": None,
        "init_same_noise": True,
    },
}


def _recipe_of(name: str) -> dict:
    """The preset's values in the table's terms."""
    config, train = preset_config(name), get_preset(name)
    model, t, g = config.model, config.train, train.grpo
    return dict(
        resolution=model.resolution,
        lora=(model.lora_rank, model.lora_alpha),
        guidance=model.guidance,
        eval_guidance=model.guidance if model.eval_guidance is None else model.eval_guidance,
        num_steps=train.sampler.num_steps,
        validation_steps=train.validation_steps or train.sampler.num_steps,
        noise_level=train.sampler.noise_level,
        trained_steps=len(train.sampler_at(0).sde_steps),
        random_window=None if train.sde_window_size is None else (train.sde_window_size, train.sde_window_range),
        group_size=train.group_size,
        prompts_per_iteration=train.prompts_per_iteration,
        minibatches=g.num_minibatches,
        epochs=g.num_epochs,
        lr=g.lr,
        weight_decay=g.weight_decay,
        clip_range=g.clip_range,
        adv_clip=g.adv_clip,
        adv_norm=g.adv_norm,
        kl_beta=g.kl_beta,
        ema=None if train.ema is None else (train.ema.decay, train.ema.every),
        init_same_noise=train.init_same_noise,
        reward=t.reward,
        seed=t.seed,
    )


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_preset_holds_the_values_of_the_config_it_cites(name):
    assert _recipe_of(name) == RECIPES[name]


def test_every_recipe_preset_is_in_the_table_and_in_the_docs():
    assert set(RECIPE_PRESETS) == set(RECIPES) and set(RECIPES) <= set(PRESETS)
    models = (Path(__file__).parents[3] / "docs" / "MODELS.md").read_text()
    for name in RECIPES:
        assert f"`{name}`" in models, f"docs/MODELS.md has no column for {name}"


@pytest.mark.parametrize(
    "family_preset,recipe",
    [("sd35m_lora", "sd35m_geneval"), ("qwen_image_lora", "qwen_image_pickscore"), ("flux1_lora", "flux1_flow_grpo")],
)
def test_a_familys_preset_is_its_cited_recipe(family_preset, recipe):
    assert _recipe_of(family_preset) == RECIPES[recipe]
    assert preset_config(family_preset).model_dump(exclude={"preset"}) == preset_config(recipe).model_dump(
        exclude={"preset"}
    )
