"""The trainer's configs (`TrainConfig` with its `SamplerConfig` and `GRPOConfig`, a diffusers pipeline's
`ModelSpec` fields) made from a resolved `RunConfig`: the one place a run's settings become what the code computes
with. Every field is passed explicitly, so no default of the dataclasses below stands in for a setting.

Example:
    train = train_config(resolved.config)          # reads and checks --prompts once
    fields = model_spec_fields(resolved.config)     # None for the pixel policy
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from resources.settings.config import RunConfig
from workers.algo.ema import EMAConfig
from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.model.families.identify import detect_family
from workers.model.families.model_spec import ModelSpec
from workers.model.families.prompt_limits import check_prompts_fit
from workers.model.families.registry import family_for
from workers.model.tiny_policy import SHIPPED_OCR_BASE, shipped_base_for
from workers.task.miniocr import parse_ocr_prompt
from workers.task.prompt_file import PromptSource
from workers.task.prompts import parse_prompt
from workers.trainer.train_config import TrainConfig


def sampler_config(config: RunConfig) -> SamplerConfig:
    s = config.sampling
    return SamplerConfig(
        num_steps=s.num_steps,
        noise_level=s.noise_level,
        shift=s.shift,
        sde_window=s.sde_window,
        forward_dtype=s.forward_dtype,
    )


def grpo_config(config: RunConfig) -> GRPOConfig:
    t = config.train
    return GRPOConfig(
        lr=t.lr,
        clip_range=t.clip_range,
        adv_clip=t.adv_clip,
        adv_norm=t.adv_norm,
        advantage=t.advantage,
        kl_beta=t.kl_beta,
        kl_form=t.kl_form,
        num_epochs=t.epochs,
        num_minibatches=t.minibatches,
        max_grad_norm=t.max_grad_norm,
        lr_warmup_steps=t.lr_warmup_steps,
        lr_schedule=t.lr_schedule,
        weight_decay=t.weight_decay,
        objective=t.objective,
        nft_beta=t.nft_beta,
        nft_timesteps=t.nft_timesteps,
        nft_adv_scale=t.nft_adv_scale,
        nft_weighting=t.nft_weighting,
    )


def train_config(config: RunConfig, prompts: Optional[PromptSource] = None) -> TrainConfig:
    """The TrainConfig of `config`; its prompts file is read and checked against the policy here (pass `prompts`
    to reuse one already read)."""
    t = config.train
    if t.prompts is not None and prompts is None:
        prompts = training_prompts(t.prompts, t.prompts_heldout, config.model.model, model_spec_fields(config))
    if t.prompts is None and t.prompts_heldout:
        raise ValueError("train.prompts_heldout (--prompts-heldout) applies to a prompts file (--prompts)")
    return TrainConfig(
        iterations=t.iterations,
        prompts_per_iteration=t.prompts_per_iteration,
        group_size=t.group_size,
        rollouts_per_prompt=t.rollouts_per_prompt,
        reward=t.reward,
        sampler=sampler_config(config),
        grpo=grpo_config(config),
        seed=t.seed,
        validate_every=config.validation.validate_every,
        validation_seeds=config.validation.validation_seeds,
        train_categories=t.train_categories,
        prompts=prompts,
        seeds_per_request=config.sampling.seeds_per_request,
        rollout_batch=config.sampling.rollout_batch,
        micro_batch=t.micro_batch,
        sde_window_size=config.sampling.sde_window_size,
        sde_window_range=config.sampling.sde_window_range,
        init_same_noise=config.sampling.init_same_noise,
        ema=EMAConfig(decay=t.ema_decay, every=t.ema_every) if t.ema else None,
        eval_guidance=config.model.eval_guidance,
        validation_steps=config.validation.validation_steps,
    )


def model_spec_fields(config: RunConfig) -> Optional[dict]:
    """ModelSpec fields of a run on a diffusers pipeline (None for the pixel policy); the folder's family and the
    resolution are checked here (UnsupportedModelError / ValueError), before any weights load."""
    m = config.model
    if m.model is None:
        return None
    fields: dict[str, Any] = {
        "resolution": m.resolution,
        "lora_rank": m.lora_rank,
        "lora_alpha": m.lora_alpha,
        "guidance": m.guidance,
        "negative_prompt": m.negative_prompt,
        "max_sequence_length": m.max_sequence_length,
        "base_dtype": m.base_dtype,
        "sync_mode": m.sync_mode,
    }
    path = Path(m.model).expanduser().resolve()
    family = detect_family(path)
    family_for(family).geometry(ModelSpec(path=str(path), family=family, **fields))
    return fields


def training_prompts(path: str, heldout_fraction: float, model: str | None, model_fields: dict | None):
    """The PromptSource of `--prompts PATH` (workers/task/prompt_file.py), checked against the run's policy before
    any weights load: prompts the pixel policy cannot read (outside MiniGenEval's words), or longer than a diffusers
    family's text encoder takes, are refused with their line number (ValueError)."""
    source = PromptSource.from_file(path, heldout_fraction)
    if model is None:
        # The pixel policy reads its task's words only: MiniOCR's on MiniOCR's shipped file (its own base), else
        # MiniGenEval's.
        ocr = shipped_base_for(path) == SHIPPED_OCR_BASE
        task, parse = ("MiniOCR", parse_ocr_prompt) if ocr else ("MiniGenEval", parse_prompt)
        for row in source.table().rows:
            try:
                parse(row.text)
            except ValueError as err:
                raise ValueError(
                    f"--prompts {source.path}: line {row.line} is not a {task} prompt ({err}); the "
                    "pixel policy reads only those: pass --model DIR to post-train a diffusers pipeline "
                    "on free text"
                ) from None
        return source

    folder = Path(model).expanduser().resolve()
    check_prompts_fit(source, ModelSpec(path=str(folder), family=detect_family(folder), **(model_fields or {})))
    return source
