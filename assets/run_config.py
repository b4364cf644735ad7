"""What a post-training run is: its name, preset, length and guards, as a Dagster resource checked at load.

A preset names a complete `TrainConfig` (workers/trainer/presets.py); the few fields here override
it. Everything is validated when the definitions load (or when `spotlight run` starts),
so an unknown preset or reward fails before any compute, with the allowed names.

Example:
    config = RunConfigResource(run="demo", preset="cpu_smoke", iterations=3)
    config.train_config().group_size, config.num_iterations
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Optional

from dagster import ConfigurableResource
from pydantic import Field, field_validator, model_validator


class RunConfigResource(ConfigurableResource):
    """The run every iteration asset works on."""

    run: str = Field(default="demo", description="Run name: the store prefix runs/{run}/ and the ledger's run_id.")
    preset: str = Field(default="cpu_tiny_spot", description="Training preset (workers/trainer/presets.py).")
    iterations: Optional[int] = Field(default=None, ge=1, description="Training iterations (default: the preset's).")
    reward: Optional[str] = Field(
        default=None, description="Reward name overriding the preset's (workers/task/rewards.py)."
    )
    seed: Optional[int] = Field(
        default=None, ge=0, description="Run seed overriding the preset's (prompts and request seeds)."
    )
    checkpoint: Optional[str] = Field(
        default=None, description="Policy folder to start from (default: the shipped base)."
    )
    device: str = Field(
        default="cpu", description="Where the trainer, in-process sampling and validation run: cpu, cuda or cuda:N."
    )
    model: Optional[str] = Field(
        default=None,
        description="A diffusers pipeline folder to post-train instead (Qwen-Image, "
        "SD3/3.5, FLUX.1; absolute path, loaded locally).",
    )
    lora_rank: Optional[int] = Field(default=None, ge=0, description="With model: LoRA rank (0 = full fine-tuning).")
    resolution: Optional[int] = Field(default=None, ge=1, description="With model: image side in pixels.")
    guidance: Optional[float] = Field(
        default=None, ge=0, description="With model: true-CFG scale or FLUX.1-dev's guidance."
    )
    sync_mode: Optional[str] = Field(
        default=None,
        description="With model and a LoRA: what PULSE ships to the rollout "
        "workers, lora (the adapter; default) or merged (BF16 base + LoRA delta of every "
        "weight: workers need no adapter).",
    )
    anchor_every: int = Field(default=10, ge=1, description="A full BF16 anchor every this many weight versions.")
    report_every: Optional[int] = Field(
        default=None,
        ge=1,
        description="Rewrite the report folder and draw sample "
        "grids every this many iterations and on the final one (default: the preset's "
        "validate_every, at most 5; each rewrite costs about a second on 2 CPU cores).",
    )
    max_validation_drop: float = Field(
        default=0.25,
        ge=0,
        description="Validation check fails when the held-out score falls more than this below the base's.",
    )
    validation_reward: Optional[str] = Field(
        default=None,
        description="Reward that scores the held-out images "
        "(default: MiniGenEval's detector for the pixel policy, the run's reward "
        "with model; workers/task/validation.py).",
    )
    validation_prompts: Optional[str] = Field(
        default=None, description="A text file of held-out prompts, one a line (default: MiniGenEval's held-out split)."
    )
    prompts: Optional[str] = Field(
        default=None,
        description="The training prompts file: text, JSON Lines, Parquet or a "
        "datasets folder (default: MiniGenEval's grammar; workers/task/prompt_file.py).",
    )
    prompts_heldout: Optional[float] = Field(
        default=None, ge=0, lt=1, description="With prompts: the share held out for validation."
    )
    on_hacking: str = Field(
        default="warn",
        description="When the reward-hacking guard flags a validation: warn, stop "
        "(end the run after that iteration; resumable) or rollback (docs/REWARD_HACKING.md).",
    )
    hacking_window: Optional[int] = Field(
        default=None,
        ge=1,
        description="Validations back the guard compares the proxy and gold rewards over (default 2).",
    )
    hacking_z: Optional[float] = Field(
        default=None,
        ge=0,
        description="Standard errors the proxy's rise and the gold's fall must each exceed (default 2).",
    )
    hacking_max_drop: Optional[float] = Field(
        default=None,
        ge=0,
        lt=1,
        description="Largest relative fall of a held-out image statistic below the base's (default 0.5; 0 = off).",
    )
    hacking_max_rise: Optional[float] = Field(
        default=None,
        gt=0,
        description="Largest relative rise of a held-out image statistic above the base's (default: rises never fire).",
    )
    rollback_lr_scale: Optional[float] = Field(
        default=None, gt=0, le=1, description="Learning-rate factor per rollback (default 0.5)."
    )
    rollback_kl_beta: Optional[float] = Field(
        default=None, ge=0, description="KL coefficient at least, after a rollback (default: the preset's)."
    )
    reserved_usd_per_hour: float = Field(
        default=0.10, ge=0, description="Price of the reserved node (trainer + coordinator)."
    )
    rollout_batch: Optional[int] = Field(
        default=None,
        ge=1,
        description="Samples sampled and VAE-decoded together where "
        "the trainer's process samples (default: the preset's).",
    )
    micro_batch: Optional[int] = Field(
        default=None,
        ge=1,
        description="Samples per forward and backward in the update (gradient accumulation; default: the preset's).",
    )
    group_size: Optional[int] = Field(
        default=None, ge=2, description="Samples per prompt in the update (default: the preset's)."
    )
    prompts_per_iteration: Optional[int] = Field(
        default=None, ge=1, description="Prompts per iteration (default: the preset's)."
    )
    minibatches: Optional[int] = Field(
        default=None, ge=1, description="Optimizer steps per epoch (default: the preset's)."
    )
    advantage: Optional[str] = Field(
        default=None,
        description="What the advantages normalise within each group: total (the reward) or per-component (each "
        "component of a multi: reward, then weighted; docs/REWARD_HACKING.md). Default: the preset's (total).",
    )

    @field_validator("run")
    @classmethod
    def _run_name(cls, run: str) -> str:
        from resources.keys import check_name

        return check_name(run, "run name")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, preset: str) -> str:
        from workers.trainer.presets import PRESETS

        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        return preset

    @field_validator("reward")
    @classmethod
    def _known_reward(cls, reward: Optional[str]) -> Optional[str]:
        from workers.task.rewards import get_reward

        if reward is not None:
            get_reward(reward)  # a name, kind:ARG (clip:PATH, multi:...) or a reward server URL; the error lists them
        return reward

    @field_validator("device")
    @classmethod
    def _device_present(cls, device: str) -> str:
        from workers.coordinator.context import check_device

        return check_device(device)

    @model_validator(mode="after")
    def _config_builds(self) -> "RunConfigResource":
        self.train_config()  # any invalid combination fails at load, not mid-run
        self.model_spec_fields()
        self.validation_config()
        self.hacking_config()
        return self

    def hacking_config(self):
        """The reward-hacking guard's rule and action (workers.coordinator.hacking_guard.HackingGuardConfig)."""
        from workers.coordinator.hacking_guard import hacking_from_options

        return hacking_from_options(
            self.on_hacking,
            self.hacking_window,
            self.hacking_z,
            self.hacking_max_drop,
            self.hacking_max_rise,
            self.rollback_lr_scale,
            self.rollback_kl_beta,
        )

    def validation_config(self):
        """The validation reward and held-out prompts (workers.task.validation.ValidationConfig, the prompts file
        read now), checked against the run's reward and policy."""
        from workers.task.validation import validation_from_options

        config = self.train_config()
        return validation_from_options(
            self.validation_reward,
            self.validation_prompts,
            config.reward,
            model=self.model is not None,
            train_prompts=config.prompts,
        )

    def model_spec_fields(self) -> Optional[dict]:
        """ModelSpec fields of a run on a diffusers pipeline (None for the pixel policy); the folder and the
        resolution are checked here, before any weights load."""
        given = {
            "lora_rank": self.lora_rank,
            "resolution": self.resolution,
            "guidance": self.guidance,
            "sync_mode": self.sync_mode,
        }
        if self.model is None:
            if any(v is not None for v in given.values()):
                raise ValueError(
                    f"{', '.join(k for k, v in given.items() if v is not None)}: only for a diffusers "
                    "pipeline; set model too (--model, SPOTLIGHT_MODEL)"
                )
            return None
        if self.checkpoint is not None:
            raise ValueError("set model (a diffusers pipeline) or checkpoint (a spotlight policy), not both")
        from workers.trainer.presets import model_fields_for

        return model_fields_for(self.preset, self.model, **given)

    def train_config(self):
        """The preset's TrainConfig with this resource's overrides."""
        from workers.trainer.grpo_trainer import check_reward_chosen
        from workers.trainer.presets import get_preset

        config = get_preset(self.preset)
        changes = {
            "iterations": self.iterations,
            "reward": self.reward,
            "seed": self.seed,
            "rollout_batch": self.rollout_batch,
            "micro_batch": self.micro_batch,
            "group_size": self.group_size,
            "prompts_per_iteration": self.prompts_per_iteration,
        }
        grpo = {"num_minibatches": self.minibatches, "advantage": self.advantage}
        if any(v is not None for v in grpo.values()):
            changes["grpo"] = dataclasses.replace(config.grpo, **{k: v for k, v in grpo.items() if v is not None})
        if self.prompts is not None:
            changes.update(
                prompts=_prompt_source(
                    self.prompts,
                    self.prompts_heldout or 0.0,
                    self.model,
                    json.dumps(self.model_spec_fields(), sort_keys=True),
                ),
                train_categories=None,
            )
        elif self.prompts_heldout:
            raise ValueError("prompts_heldout (--prompts-heldout) applies to a prompts file (--prompts)")
        config = dataclasses.replace(config, **{k: v for k, v in changes.items() if v is not None})
        check_reward_chosen(config, self.preset)
        return config

    @property
    def num_iterations(self) -> int:
        """Training iterations; partition it-{N} is the final one (sync and validate the last weights)."""
        return self.train_config().iterations

    def validates(self, iteration: int) -> bool:
        """Whether iteration k's validation phase scores the held-out split (the base, every
        validate_every iterations, and the final weights)."""
        every = self.train_config().validate_every
        return iteration % every == 0 or iteration >= self.num_iterations


@functools.lru_cache(maxsize=4)
def _prompt_source(path: str, heldout: float, model: Optional[str], model_fields_json: str):
    """The run's prompts file, read and checked once per process (the config is rebuilt every iteration)."""
    from workers.trainer.presets import training_prompts

    return training_prompts(path, heldout, model, json.loads(model_fields_json))
