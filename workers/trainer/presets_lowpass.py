"""The low-pass task of SPOTLIGHT's headline test (docs/EXPLORATION.md, "The headline, pre-registered"): the strict
all-or-nothing reward on the three categories the shipped base passes least, with groups of 4, where random groups
are often dead (every sample fails) and a seed plan that finds the one that passes gives a group its only contrast.

Example:
    config = lowpass(cpu_tiny_spot())
    config.train.train_categories, config.train.group_size   # ('position', 'counting_binding', 'color_binding'), 4
"""

from __future__ import annotations

from resources.settings.config import RunConfig
from resources.settings.resolve import derive

LOWPASS_CATEGORIES = ("position", "counting_binding", "color_binding")
"""The training categories whose strict pass rate on the shipped base is lowest (0.19, 0.20, 0.38 over 8 prompts x
32 seeds, /work/shared/REFERENCES.md "where seed choice can matter")."""

LOWPASS_GROUP_SIZE = 4
"""G: samples per prompt of R_G and E_G (R_2G draws twice as many)."""

LOWPASS_VALIDATION_SEEDS = 8
"""8 seeds x the 64 held-out prompts = 512 images per reading (SE of a strict pass rate near 0.3: about 0.02)."""


def lowpass(base: RunConfig) -> RunConfig:
    """cpu_tiny_spot's NFT recipe (given as `base`) on the low-pass task: `minigeneval_strict` over position,
    counting_binding and color_binding, 8 prompts x G = 4 samples per iteration, 512 held-out images every 5
    iterations, 15 iterations (the headline's pilot ran 10, reading versions 0 and 10: docs/BENCHMARKS.md). It
    explores with one arm, m16-half_steps (16 candidates at half steps), and the plan keeps G (no pre-filter, no
    control prompt)."""
    return derive(
        base,
        "cpu_tiny_lowpass",
        train=dict(
            reward="minigeneval_strict",
            train_categories=LOWPASS_CATEGORIES,
            group_size=LOWPASS_GROUP_SIZE,
            iterations=15,
        ),
        sampling=dict(seeds_per_request=LOWPASS_GROUP_SIZE),
        validation=dict(validation_seeds=LOWPASS_VALIDATION_SEEDS, validate_every=5),
        explore=dict(
            seed_multipliers=(4,), cache_levels=("half_steps",), keep_factor=1.0, control_prompts=0, min_arm_tau=None
        ),
    )
