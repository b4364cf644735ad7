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
from typing import Annotated, Any, Optional

from dagster import ConfigurableResource
from pydantic import Field, create_model, field_validator, model_validator

from resources.settings import SETTINGS, Setting, resource_settings


def pydantic_type(setting: Setting) -> Any:
    """The setting's type with its bounds, as pydantic validates it (a resource field, a SPOTLIGHT_* value)."""
    return Annotated[setting.type, Field(**setting.bounds)]


def _resource_type(setting: Setting) -> Any:
    """pydantic_type, but an optional choice of names is an optional str, checked by `_known_choice`: Dagster's
    config types take a Literal, not an Optional one."""
    if setting.choices() and setting.default is None:
        return Annotated[Optional[str], Field(**setting.bounds)]
    return pydantic_type(setting)


_RunSettingsFields = create_model(
    "RunSettingsFields",
    __base__=ConfigurableResource,
    **{s.name: (_resource_type(s), Field(default=s.default, description=s.help)) for s in resource_settings()},
)
_OPTIONAL_CHOICES = tuple(s.name for s in resource_settings() if s.choices() and s.default is None)


class RunConfigResource(_RunSettingsFields):
    """The run every iteration asset works on; its fields are the run settings of resources/settings/."""

    @field_validator(*_OPTIONAL_CHOICES)
    @classmethod
    def _known_choice(cls, value: Optional[str], info) -> Optional[str]:
        choices = SETTINGS[info.field_name].choices()
        if value is not None and value not in choices:
            raise ValueError(f"{info.field_name} must be one of {choices}, got {value!r}")
        return value

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
