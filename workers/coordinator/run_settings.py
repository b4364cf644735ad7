"""A run's resolved config with what the code computes with, made once: the trainer's TrainConfig, the diffusers
model's fields, the validation, reward-hacking and exploration settings. Every check that can refuse the config
runs here, before any compute: an unknown reward, a folder that is no supported pipeline, a prompts file the
policy or the reward cannot read, a device this machine lacks.

Example:
    settings = RunSettings.of(resolved.config)
    settings.train.group_size, settings.model_fields, settings.run_name
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from resources.settings.config import RunConfig
from workers.coordinator.hacking_guard import HackingGuardConfig, hacking_from_options
from workers.explore.state import ExploreConfig, explore_config_of
from workers.task.reward_prompts import check_reward_reads_prompts
from workers.task.validation import ValidationConfig, validation_from_options
from workers.trainer.from_config import model_spec_fields, train_config
from workers.trainer.train_config import TrainConfig, check_reward_chosen


@dataclass(frozen=True)
class RunSettings:
    config: RunConfig
    train: TrainConfig
    model_fields: Optional[dict]
    """ModelSpec fields of a diffusers pipeline run; None for the pixel policy."""
    validation: ValidationConfig
    hacking: HackingGuardConfig
    explore: ExploreConfig

    @classmethod
    def of(cls, config: RunConfig) -> "RunSettings":
        """Everything derived from `config`, checked; ValueError saying what to change."""
        from workers.coordinator.context import check_device

        check_device(config.train.device)
        model_fields = model_spec_fields(config)
        train = train_config(config)
        check_reward_chosen(train, config.preset)
        check_reward_reads_prompts(train.reward, train.prompts)
        v, g = config.validation, config.guard
        validation = validation_from_options(
            v.validation_reward,
            v.validation_prompts,
            train.reward,
            config.model.model is not None,
            train.prompts,
            max_prompts=v.validation_max_prompts,
        )
        hacking = hacking_from_options(
            g.on_hacking,
            g.hacking_window,
            g.hacking_z,
            g.hacking_max_drop,
            g.hacking_max_rise,
            g.rollback_lr_scale,
            g.rollback_kl_beta,
        )
        return cls(config, train, model_fields, validation, hacking, explore_config_of(config))

    @property
    def run_name(self) -> str:
        """The store prefix runs/{run}/ and the ledger's run id: deployment.run, else the run folder's name."""
        from resources.keys import check_name
        from workers.coordinator.context import run_name_for

        d = self.config.deployment
        return check_name(d.run, "run name") if d.run else run_name_for(Path(d.run_dir))

    @property
    def checkpoint(self) -> Optional[str]:
        """Weights version 0: the diffusers pipeline folder, the policy folder, or None (the shipped base)."""
        return self.config.model.model or self.config.model.checkpoint

    @property
    def report_every(self) -> int:
        return self.config.validation.report_every or min(self.train.validate_every, 5)
