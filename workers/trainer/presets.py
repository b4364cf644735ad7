"""Named training presets: functions that return a complete TrainConfig.

Example:
    config = get_preset("cpu_tiny")
    config = dataclasses.replace(config, iterations=10)
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.model.families.identify import detect_family
from workers.model.families.model_spec import ModelSpec
from workers.model.families.prompt_limits import check_prompts_fit
from workers.model.families.registry import family_for
from workers.task.prompt_file import PromptSource
from workers.task.prompts import parse_prompt
from workers.trainer import presets_ocr
from workers.trainer.grpo_trainer import NO_REWARD, TrainConfig


def cpu_tiny() -> TrainConfig:
    """The pipeline's former default (cpu_tiny_spot is now): the shipped 2.5M-parameter base on 2 CPU cores,
    20 iterations.

    The NFT objective (advantage-weighted flow matching, DiffusionNFT's adaptive x0-space
    weighting) on deterministic ODE rollouts, the sampler validation uses. Why, and what
    it has achieved: docs/RECIPE.md.
    """
    return TrainConfig(
        iterations=20,
        prompts_per_iteration=8,
        group_size=8,
        reward="minigeneval",
        sampler=SamplerConfig(num_steps=8, noise_level=0.0),
        grpo=GRPOConfig(
            objective="nft",
            lr=1e-4,
            adv_clip=5.0,
            kl_beta=0.0,
            num_epochs=1,
            num_minibatches=2,
            nft_beta=1.0,
            nft_timesteps=2,
            nft_adv_scale=2.0,
            nft_weighting="adaptive",
        ),
        validate_every=5,
        validation_seeds=2,
    )


def cpu_tiny_long() -> TrainConfig:
    """`spotlight train`'s default: cpu_tiny spending more of the 15-minute budget on 2 CPU cores.

    Each prompt draws 16 samples and the update keeps the 8 of largest reward variance (drawing
    is cheap next to scoring in the update); each kept image is scored at 6 noise levels per
    update instead of 2; 40 iterations. Over eight seeds it gains about +0.15 held-out strict to
    cpu_tiny's +0.07, every seed at least +0.09 (docs/BENCHMARKS.md, docs/RECIPE.md).
    """
    base = cpu_tiny()
    return dataclasses.replace(
        base, iterations=40, rollouts_per_prompt=16, grpo=dataclasses.replace(base.grpo, nft_timesteps=6)
    )


def cpu_tiny_spot() -> TrainConfig:
    """`spotlight run`'s default (`make demo`): `spotlight train`'s recipe (cpu_tiny_long) with SPOTLIGHT's
    split of the work. The high-contrast seeds come from exploration on the stale weights beside training
    (the bandit's seeds per prompt x cache level), not from a wider draw on the critical path. Its pipeline
    explores as a pre-filter (the rollout samples 1.5 G explored seeds and trains the G of largest fresh-reward
    variance) with one control prompt per iteration (`workers.explore.state.explore_config_for`): over seeds 0-2
    of `make demo` that gained +0.13 held-out on average where exploration's final pick (W = G) gained +0.08.
    Each rollout request samples a prompt's whole group as one batch; the held-out split is scored every 10
    iterations.
    How it learns and where its time goes: docs/BENCHMARKS.md ("make demo")."""
    base = cpu_tiny_long()
    return dataclasses.replace(base, iterations=30, rollouts_per_prompt=None, seeds_per_request=8, validate_every=10)


HARD_CATEGORIES = ("counting", "position", "color_binding", "counting_binding")
"""The categories cpu_tiny_hard trains on: counting, spatial relations, attribute binding."""


def cpu_tiny_hard() -> TrainConfig:
    """A task where seed choice matters: cpu_tiny_spot on the all-or-nothing reward (`minigeneval_strict`: 1 only
    when every criterion of the prompt holds) over counting, position and binding prompts. Random groups often
    all fail (or all pass) and teach nothing; a plan that finds a seed that passes gives the group its only
    contrast. Its pipeline explores as cpu_tiny_spot's does (a pre-filter with one control prompt per
    iteration). Its zero-variance share: `spotlight bench selection --preset
    cpu_tiny_hard` (docs/BENCHMARKS.md)."""
    return dataclasses.replace(cpu_tiny_spot(), reward="minigeneval_strict", train_categories=HARD_CATEGORIES)


def cpu_tiny_flow_grpo() -> TrainConfig:
    """Flow-GRPO's recipe on the same budget: SDE rollouts (noise level 0.7) on a 4-step window,
    PPO-clip on the step log-probs. Kept for comparison (docs/RECIPE.md)."""
    return TrainConfig(
        iterations=20,
        prompts_per_iteration=8,
        group_size=8,
        reward="minigeneval",
        sampler=SamplerConfig(num_steps=8, noise_level=0.7, sde_window=(0, 4)),
        grpo=GRPOConfig(lr=5e-5, clip_range=1e-4, adv_clip=5.0, kl_beta=0.0, num_epochs=1, num_minibatches=2),
        validate_every=5,
        validation_seeds=2,
    )


def cpu_smoke() -> TrainConfig:
    """Two small iterations: checks the whole loop runs (tests, CI), not that it learns."""
    return TrainConfig(
        iterations=2,
        prompts_per_iteration=2,
        group_size=4,
        sampler=SamplerConfig(num_steps=4, noise_level=0.7, forward_dtype="fp32"),
        grpo=GRPOConfig(num_minibatches=1),
        validate_every=1,
        validation_seeds=1,
    )


def cpu_smoke_nft() -> TrainConfig:
    """cpu_smoke's two small iterations with the default recipe's objective (cpu_tiny_long's NFT settings, a wider
    draw of 8 kept 4): pins the NFT path's numbers in the golden test, not a recipe that learns."""
    smoke, recipe = cpu_smoke(), cpu_tiny_long()
    return dataclasses.replace(
        smoke,
        rollouts_per_prompt=8,
        sampler=dataclasses.replace(smoke.sampler, noise_level=0.0),
        grpo=dataclasses.replace(recipe.grpo, num_minibatches=1),
    )


GPU_ROLLOUT_BATCH = 8
"""The GPU presets sample and VAE-decode 8 requests at a time: a 512-px Qwen-Image decode holds about 1.7 GB of
activations per image in BF16 (docs/MODELS.md, "Memory"); the whole iteration (256 samples) would not fit."""
GPU_MICRO_BATCH = 8
"""The GPU presets' samples per forward and backward (both CFG passes carry gradients): a 64-sample minibatch in
8 accumulated micro-batches, the same step."""


def checkpointing_by_default(preset: str) -> bool:
    """Gradient checkpointing is on for the GPU presets (the ones with MODEL_DEFAULTS), off for the CPU ones."""
    return preset in MODEL_DEFAULTS


def sd35m_lora() -> TrainConfig:
    """Flow-GRPO's SD3.5-M recipe (the Flow-GRPO paper's): 10 SDE steps at noise level 0.7, groups of 24, clip
    1e-4, advantage clip 5, KL beta 0.04, LoRA r=32 at lr 3e-4, CFG 4.5 (MODEL_DEFAULTS). For a GPU, on the user's
    prompts (--prompts) and reward (--reward: the preset names none)."""
    return TrainConfig(
        iterations=300,
        prompts_per_iteration=16,
        group_size=24,
        reward=NO_REWARD,
        sampler=SamplerConfig(num_steps=10, noise_level=0.7, forward_dtype="bf16"),
        # kl_form "flow_grpo": the KL term as flow_grpo computes it, so its beta 0.04 weighs what it weighed there
        grpo=GRPOConfig(
            lr=3e-4, clip_range=1e-4, adv_clip=5.0, kl_beta=0.04, kl_form="flow_grpo", num_epochs=1, num_minibatches=4
        ),
        validate_every=10,
        validation_seeds=1,
        rollout_batch=GPU_ROLLOUT_BATCH,
        micro_batch=GPU_MICRO_BATCH,
    )


def qwen_image_lora() -> TrainConfig:
    """Flow-GRPO's Qwen-Image recipe (the Flow-GRPO paper's): 10 steps, noise level 1.2 on a 2-step SDE window,
    groups of 16, clip 1e-4, KL beta 0.04, LoRA at lr 3e-4, true CFG 4.5 (MODEL_DEFAULTS). For a GPU."""
    base = sd35m_lora()
    return dataclasses.replace(
        base,
        group_size=16,
        sampler=SamplerConfig(num_steps=10, noise_level=1.2, sde_window=(0, 2), forward_dtype="bf16"),
    )


def flux1_lora() -> TrainConfig:
    """FLUX.1-dev: the SD3.5-M recipe with FLUX.1-dev's guidance embedding at 3.5 instead of true CFG (no FLUX
    figures in the Flow-GRPO paper; these are SD3.5-M's, unverified on FLUX). For a GPU."""
    return sd35m_lora()


PRESETS: dict[str, Callable[[], TrainConfig]] = {
    "cpu_tiny": cpu_tiny,
    "cpu_tiny_long": cpu_tiny_long,
    "cpu_tiny_spot": cpu_tiny_spot,
    "cpu_tiny_hard": cpu_tiny_hard,
    "cpu_tiny_flow_grpo": cpu_tiny_flow_grpo,
    "cpu_tiny_ocr": lambda: presets_ocr.cpu_tiny_ocr(cpu_tiny()),
    "cpu_tiny_ocr_spot": lambda: presets_ocr.cpu_tiny_ocr_spot(cpu_tiny_spot()),
    "cpu_smoke": cpu_smoke,
    "cpu_smoke_nft": cpu_smoke_nft,
    "sd35m_lora": sd35m_lora,
    "qwen_image_lora": qwen_image_lora,
    "flux1_lora": flux1_lora,
}

MODEL_DEFAULTS: dict[str, dict] = {
    "sd35m_lora": {"resolution": 512, "lora_rank": 32, "guidance": 4.5, "base_dtype": "bf16"},
    "qwen_image_lora": {"resolution": 512, "lora_rank": 64, "guidance": 4.5, "base_dtype": "bf16"},
    "flux1_lora": {"resolution": 512, "lora_rank": 32, "guidance": 3.5, "base_dtype": "bf16"},
}
"""A GPU preset's ModelSpec defaults for `--model` (the command line overrides each)."""


def get_preset(name: str) -> TrainConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()


def model_fields_for(preset: str, model: str, **given) -> dict:
    """The ModelSpec fields of a run on the diffusers pipeline folder `model`: the preset's MODEL_DEFAULTS, then
    `given` (lora_rank, resolution, guidance, ...; None = unset). The folder's family and the resolution are
    checked here (UnsupportedModelError / ValueError), before any weights load."""
    from pathlib import Path

    fields = {**MODEL_DEFAULTS.get(preset, {}), **{k: v for k, v in given.items() if v is not None}}
    path = Path(model).expanduser().resolve()
    family = detect_family(path)
    family_for(family).geometry(ModelSpec(path=str(path), family=family, **fields))
    return fields


def training_prompts(path: str, heldout_fraction: float, model: str | None, model_fields: dict | None):
    """The PromptSource of `--prompts PATH` (workers/task/prompt_file.py), checked against the run's policy before
    any weights load: prompts the pixel policy cannot read (outside MiniGenEval's words), or longer than a diffusers
    family's text encoder takes, are refused with their line number (ValueError)."""
    from pathlib import Path

    source = PromptSource.from_file(path, heldout_fraction)
    if model is None:
        for row in source.table().rows:
            try:
                parse_prompt(row.text)
            except ValueError as err:
                raise ValueError(
                    f"--prompts {source.path}: line {row.line} is not a MiniGenEval prompt ({err}); the "
                    "pixel policy reads only those: pass --model DIR to post-train a diffusers pipeline "
                    "on free text"
                ) from None
        return source

    folder = Path(model).expanduser().resolve()
    check_prompts_fit(source, ModelSpec(path=str(folder), family=detect_family(folder), **(model_fields or {})))
    return source
