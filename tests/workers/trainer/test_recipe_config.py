"""The recipe fields in the run's config tree: each has one home with its bounds, reaches the trainer's config, is
refused with a message where it cannot run, and leaves every existing preset as it was."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from resources.settings.config import RunConfig
from resources.settings.resolve import ConfigError, flag_layer, resolve
from workers.algo.ema import EMAConfig
from workers.trainer.from_config import train_config
from workers.trainer.presets import PRESETS


def test_the_recipe_fields_reach_the_trainer():
    config = RunConfig(
        train=dict(ema=True, ema_decay=0.8, ema_every=4, adv_norm="global_std"),
        sampling=dict(num_steps=10, sde_window_size=3, sde_window_range=(0, 5), init_same_noise=True),
        validation=dict(validation_steps=40),
        explore=dict(explore=False),
    )
    train = train_config(config)
    assert (train.sde_window_size, train.sde_window_range, train.init_same_noise) == (3, (0, 5), True)
    assert train.ema == EMAConfig(decay=0.8, every=4) and train.grpo.adv_norm == "global_std"
    assert train.validation_steps == 40 and train.eval_guidance is None
    assert (
        train.sampler.sde_window is None and train.sampler_at(0).sde_window[1] - train.sampler_at(0).sde_window[0] == 3
    )


def test_every_existing_cpu_preset_keeps_todays_behaviour():
    for name, preset in PRESETS.items():
        if not name.startswith("cpu_"):
            continue
        train = train_config(preset())
        assert (train.sde_window_size, train.init_same_noise, train.ema) == (None, False, None), name
        assert (train.eval_guidance, train.validation_steps) == (None, None), name
        assert train.sampler_at(3) == train.sampler, name


@pytest.mark.parametrize(
    "sections,message",
    [
        (dict(sampling=dict(sde_window=(0, 2), sde_window_size=2)), "set one"),
        (dict(sampling=dict(num_steps=10, sde_window_size=3, sde_window_range=(0, 2))), "span at least"),
        (dict(sampling=dict(sde_window_range=(0, 2))), "set both"),
        (dict(sampling=dict(init_same_noise=True)), "set explore.explore false"),
        (dict(train=dict(ema_decay=1.0)), "less than 1"),
        (dict(train=dict(adv_norm="global")), "global_std"),
    ],
)
def test_a_recipe_field_that_cannot_run_is_refused_with_what_to_change(sections, message):
    with pytest.raises(ValidationError, match=message):
        RunConfig(**sections)


def test_the_evaluation_guidance_is_a_diffusers_pipelines_setting():
    with pytest.raises(ConfigError, match="model.eval_guidance"):
        resolve([flag_layer({"eval_guidance": 4.5})], PRESETS)
