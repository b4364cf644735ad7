"""Named presets: functions that each return a whole `RunConfig` (resources/settings/config.py), in one registry.

A preset is where a recipe's every value is written down; `spotlight config --preset NAME` prints one whole, and a
run's `--config FILE`, SPOTLIGHT_* variables and flags change it (resources/settings/resolve.py). Presets derive from
one another with `derive`, so a value stated once is inherited.

Example:
    config = preset_config("cpu_tiny")              # a RunConfig
    train = get_preset("cpu_tiny")                  # its TrainConfig (workers/trainer/from_config.py)
"""

from __future__ import annotations

from typing import Callable

from resources.settings.config import RunConfig
from resources.settings.resolve import derive
from workers.trainer import presets_lowpass, presets_ocr, presets_recipes
from workers.trainer.from_config import train_config
from workers.trainer.train_config import TrainConfig

CPU_EXPLORE_BUDGET_ROLLOUTS = 2.0
"""The CPU presets' exploration budget per iteration, in rollouts' worth of full-sampler samples (about what the demo's
two spot workers explore beside an update; the exploration bench's default budget): a run seed is the same run
whatever the machine's load. The GPU presets stop exploring when training ends (explorers are otherwise idle spot
GPUs, and waiting for them would cost the critical path)."""


def cpu_tiny() -> RunConfig:
    """The shipped 2.5M-parameter base on 2 CPU cores, 20 iterations.

    The NFT objective (advantage-weighted flow matching, DiffusionNFT's adaptive x0-space weighting) on deterministic
    ODE rollouts, the sampler validation uses. Why, and what it has achieved: docs/RECIPE.md.
    """
    return RunConfig(
        preset="cpu_tiny",
        train=dict(
            iterations=20,
            prompts_per_iteration=8,
            group_size=8,
            reward="minigeneval",
            objective="nft",
            lr=1e-4,
            adv_clip=5.0,
            kl_beta=0.0,
            epochs=1,
            minibatches=2,
            nft_beta=1.0,
            nft_timesteps=2,
            nft_adv_scale=2.0,
            nft_weighting="adaptive",
        ),
        sampling=dict(num_steps=8, noise_level=0.0),
        validation=dict(validate_every=5, validation_seeds=2),
        explore=dict(explore_budget_rollouts=CPU_EXPLORE_BUDGET_ROLLOUTS),
    )


def cpu_tiny_long() -> RunConfig:
    """`spotlight train`'s default: cpu_tiny spending more of the 15-minute budget on 2 CPU cores.

    Each prompt draws 16 samples and the update keeps the 8 of largest reward variance (drawing is cheap next to
    scoring in the update); each kept image is scored at 6 noise levels per update instead of 2; 40 iterations. Over
    eight seeds it gains about +0.15 held-out strict to cpu_tiny's +0.07, every seed at least +0.09
    (docs/BENCHMARKS.md, docs/RECIPE.md).
    """
    return derive(cpu_tiny(), "cpu_tiny_long", train=dict(iterations=40, rollouts_per_prompt=16, nft_timesteps=6))


def cpu_tiny_spot() -> RunConfig:
    """`spotlight run`'s default (`make demo`): `spotlight train`'s recipe (cpu_tiny_long) with SPOTLIGHT's split of
    the work. The high-contrast seeds come from exploration on the stale weights beside training, not from a wider
    draw on the critical path. It explores as a pre-filter (the rollout samples 1.5 G explored seeds and trains the
    G of largest fresh-reward variance) with one control prompt per iteration and arms below Kendall tau 0.2 dropped:
    over seeds 0-2 of `make demo` that gained +0.13 held-out on average where exploration's final pick (keep factor
    1) gained +0.08. Each rollout request samples a prompt's whole group as one batch; the held-out split is scored
    every 10 iterations on 8 seeds per prompt (512 images a reading, standard error about 0.02). How it learns and
    where its time goes: docs/BENCHMARKS.md ("make demo")."""
    return derive(
        cpu_tiny_long(),
        "cpu_tiny_spot",
        train=dict(iterations=30, rollouts_per_prompt=None),
        sampling=dict(seeds_per_request=8),
        validation=dict(validate_every=10, validation_seeds=DEMO_VALIDATION_SEEDS),
        explore=dict(keep_factor=1.5, control_prompts=1, min_arm_tau=0.2),
    )


DEMO_VALIDATION_SEEDS = 8
"""cpu_tiny_spot's held-out seeds per prompt: 8 x the 64 held-out prompts = 512 images a reading (the presets it
begins, cpu_tiny_hard and cpu_tiny_ocr_spot, keep cpu_tiny's 2)."""


HARD_CATEGORIES = ("counting", "position", "color_binding", "counting_binding")
"""The categories cpu_tiny_hard trains on: counting, spatial relations, attribute binding."""


def cpu_tiny_hard() -> RunConfig:
    """A task where seed choice matters: cpu_tiny_spot on the all-or-nothing reward (`minigeneval_strict`: 1 only
    when every criterion of the prompt holds) over counting, position and binding prompts. Random groups often all
    fail (or all pass) and teach nothing; a plan that finds a seed that passes gives the group its only contrast. It
    explores as cpu_tiny_spot does. Its zero-variance share: `spotlight bench selection --preset cpu_tiny_hard`
    (docs/BENCHMARKS.md)."""
    return derive(
        cpu_tiny_spot(),
        "cpu_tiny_hard",
        train=dict(reward="minigeneval_strict", train_categories=HARD_CATEGORIES),
        validation=dict(validation_seeds=cpu_tiny().validation.validation_seeds),
    )


def cpu_tiny_lowpass() -> RunConfig:
    """SPOTLIGHT's headline test (docs/EXPLORATION.md): cpu_tiny_spot's NFT recipe on the strict reward over the
    three low-pass categories, G = 4, 512 held-out images per reading, one exploration arm
    (workers/trainer/presets_lowpass.py)."""
    return presets_lowpass.lowpass(cpu_tiny_spot())


def cpu_tiny_ocr() -> RunConfig:
    """cpu_tiny's NFT recipe on MiniOCR, scored by PP-OCR with flow_grpo's OCR formula
    (workers/trainer/presets_ocr.py)."""
    return presets_ocr.cpu_tiny_ocr(cpu_tiny())


def cpu_tiny_ocr_spot() -> RunConfig:
    """cpu_tiny_spot's recipe (whole groups per request) on MiniOCR, exploring as measured there: explored seeds in
    place of random ones, no pre-filter (workers/trainer/presets_ocr.py)."""
    base = cpu_tiny_spot()
    return presets_ocr.cpu_tiny_ocr_spot(
        derive(base, base.preset, validation=dict(validation_seeds=cpu_tiny().validation.validation_seeds))
    )


def cpu_tiny_flow_grpo() -> RunConfig:
    """Flow-GRPO's recipe on the same budget: SDE rollouts (noise level 0.7) on a 4-step window, PPO-clip on the
    step log-probs. Kept for comparison (docs/RECIPE.md)."""
    return RunConfig(
        preset="cpu_tiny_flow_grpo",
        train=dict(
            iterations=20,
            prompts_per_iteration=8,
            group_size=8,
            reward="minigeneval",
            objective="flow_grpo",
            lr=5e-5,
            clip_range=1e-4,
            adv_clip=5.0,
            kl_beta=0.0,
            epochs=1,
            minibatches=2,
        ),
        sampling=dict(num_steps=8, noise_level=0.7, sde_window=(0, 4)),
        validation=dict(validate_every=5, validation_seeds=2),
        explore=dict(explore_budget_rollouts=CPU_EXPLORE_BUDGET_ROLLOUTS),
    )


def cpu_smoke() -> RunConfig:
    """Two small iterations: checks the whole loop runs (tests, CI), not that it learns."""
    return RunConfig(
        preset="cpu_smoke",
        train=dict(iterations=2, prompts_per_iteration=2, group_size=4, minibatches=1),
        sampling=dict(num_steps=4, noise_level=0.7, forward_dtype="fp32"),
        # 16 of the 64 held-out prompts (4 a category): validation was over half of a smoke run's time.
        validation=dict(validate_every=1, validation_seeds=1, validation_max_prompts=SMOKE_VALIDATION_PROMPTS),
        explore=dict(explore_budget_rollouts=CPU_EXPLORE_BUDGET_ROLLOUTS),
    )


SMOKE_VALIDATION_PROMPTS = 16
"""cpu_smoke's held-out prompts, spread over MiniGenEval's 64 (`spotlight train --preset cpu_smoke`: 57 s -> 33 s on
the 2-vCPU AMD EPYC, one thread)."""


def cpu_smoke_nft() -> RunConfig:
    """cpu_smoke's two small iterations with the default recipe's objective (cpu_tiny_long's NFT settings, a wider
    draw of 8 kept 4): pins the NFT path's numbers in the golden test, not a recipe that learns."""
    recipe = cpu_tiny_long().train
    nft = {name: getattr(recipe, name) for name in NFT_RECIPE_FIELDS}
    return derive(
        cpu_smoke(),
        "cpu_smoke_nft",
        train=dict(rollouts_per_prompt=8, minibatches=1, **nft),
        sampling=dict(noise_level=0.0),
    )


NFT_RECIPE_FIELDS = (
    "objective",
    "lr",
    "adv_clip",
    "kl_beta",
    "epochs",
    "nft_beta",
    "nft_timesteps",
    "nft_adv_scale",
    "nft_weighting",
)
"""The update's recipe fields cpu_smoke_nft takes from cpu_tiny_long."""


def sd35m_lora() -> RunConfig:
    """SD3.5-M's preset: flow_grpo's `geneval_sd3` recipe (workers/trainer/presets_recipes.py `sd35m_geneval`) on the
    user's prompts and reward (--prompts, --reward: the preset names none)."""
    return derive(presets_recipes.sd35m_geneval(), "sd35m_lora")


def qwen_image_lora() -> RunConfig:
    """Qwen-Image's preset: flow_grpo's `pickscore_qwenimage` recipe (`qwen_image_pickscore`): a 2-step SDE window
    placed at random in steps 0-4, true CFG 4, no KL, global-std advantages."""
    return derive(presets_recipes.qwen_image_pickscore(), "qwen_image_lora")


def flux1_lora() -> RunConfig:
    """FLUX.1-dev's preset: flow_grpo's `pickscore_flux` recipe (`flux1_flow_grpo`): 6 steps at noise level 0.9,
    guidance embedding 3.5, no KL, global-std advantages, EMA."""
    return derive(presets_recipes.flux1_flow_grpo(), "flux1_lora")


RECIPE_PRESETS: dict[str, Callable[[], RunConfig]] = {
    "sd35m_geneval": presets_recipes.sd35m_geneval,
    "sd35m_ocr": presets_recipes.sd35m_ocr,
    "sd35m_pickscore": presets_recipes.sd35m_pickscore,
    "qwen_image_pickscore": presets_recipes.qwen_image_pickscore,
    "flux1_flow_grpo": presets_recipes.flux1_flow_grpo,
    "flux1_dancegrpo": presets_recipes.flux1_dancegrpo,
}
"""The published recipes, by name (workers/trainer/presets_recipes.py; their values beside the cited configs:
docs/MODELS.md, "Recipe presets")."""


PRESETS: dict[str, Callable[[], RunConfig]] = {
    "cpu_tiny": cpu_tiny,
    "cpu_tiny_long": cpu_tiny_long,
    "cpu_tiny_spot": cpu_tiny_spot,
    "cpu_tiny_hard": cpu_tiny_hard,
    "cpu_tiny_lowpass": cpu_tiny_lowpass,
    "cpu_tiny_flow_grpo": cpu_tiny_flow_grpo,
    "cpu_tiny_ocr": cpu_tiny_ocr,
    "cpu_tiny_ocr_spot": cpu_tiny_ocr_spot,
    "cpu_smoke": cpu_smoke,
    "cpu_smoke_nft": cpu_smoke_nft,
    "sd35m_lora": sd35m_lora,
    "qwen_image_lora": qwen_image_lora,
    "flux1_lora": flux1_lora,
    **RECIPE_PRESETS,
}
"""Every preset, by name: the one registry `spotlight config`, `run`, `train`, `launch` and the Dagster UI read."""

GPU_PRESETS = ("sd35m_lora", "qwen_image_lora", "flux1_lora", *RECIPE_PRESETS)
"""The presets written for a diffusers pipeline on a GPU."""


def preset_config(name: str) -> RunConfig:
    """The whole RunConfig of preset `name`; ValueError naming the presets there are."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]()


def get_preset(name: str) -> TrainConfig:
    """The TrainConfig of preset `name` (benches and tests that drive the trainer directly)."""
    return train_config(preset_config(name))
