"""MiniOCR's presets: the tiny model post-trained to render short strings, scored by PP-OCR (`--reward ocr`).

A run on these prompts starts from the MiniOCR base (workers/model/checkpoints/base_ocr, chosen by the prompts
file: `workers.model.tiny_policy.shipped_base_for`) and validates on the file's held-out strings with the same
reward. Figures: docs/BENCHMARKS.md ("MiniOCR").

Example:
    config = cpu_tiny_ocr(cpu_tiny())
    config.train.prompts, config.train.prompts_heldout      # the shipped MiniOCR prompts file, 0.05
"""

from __future__ import annotations

from resources.settings.config import RunConfig
from resources.settings.resolve import derive
from workers.task.miniocr import HELDOUT_FRACTION, MINIOCR_PROMPTS

MINIOCR_TASK = dict(reward="ocr", prompts=str(MINIOCR_PROMPTS.resolve()), prompts_heldout=HELDOUT_FRACTION)
"""MiniOCR's train section: the OCR reward on the shipped prompts file, its held-out strings apart."""


def cpu_tiny_ocr(base: RunConfig) -> RunConfig:
    """cpu_tiny's NFT recipe (given as `base`) on MiniOCR: 8 prompts x 8 samples an iteration on the OCR reward,
    20 iterations, the held-out strings scored every 5."""
    return derive(base, "cpu_tiny_ocr", train=dict(MINIOCR_TASK, train_categories=None))


MINIOCR_EXPLORE = dict(keep_factor=1.0, control_prompts=0, min_arm_tau=None)
"""How cpu_tiny_ocr_spot explores: E_G of SPOTLIGHT's headline test, the design measured on MiniOCR (explored seeds
in place of random ones, W = G: the plan is the final pick; every prompt explored; every arm kept), which learned
+0.030 more than random seeds over eight pre-registered seeds (docs/EXPLORATION.md). The arms are the explore
section's defaults, as `spotlight bench exploration`'s explore strategy ran them."""


def cpu_tiny_ocr_spot(base: RunConfig) -> RunConfig:
    """`spotlight run`'s recipe (cpu_tiny_spot, given as `base`: a prompt's group in one request, exploration on a
    request budget) on MiniOCR, exploring as the exploration bench measured there (`MINIOCR_EXPLORE`: no
    pre-filter, no control prompt)."""
    return derive(base, "cpu_tiny_ocr_spot", train=dict(MINIOCR_TASK, train_categories=None), explore=MINIOCR_EXPLORE)
