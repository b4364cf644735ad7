"""MiniOCR's presets: the tiny model post-trained to render short strings, scored by PP-OCR (`--reward ocr`).

A run on these prompts starts from the MiniOCR base (workers/model/checkpoints/base_ocr, chosen by the prompts
file: `workers.model.tiny_policy.shipped_base_for`) and validates on the file's held-out strings with the same
reward. Figures: docs/BENCHMARKS.md ("MiniOCR").

Example:
    config = cpu_tiny_ocr()
    config.prompts.table().heldout[:2]       # ('"LH89" in red', '"Y3" in bold blue')
"""

from __future__ import annotations

import dataclasses

from workers.task.miniocr import HELDOUT_FRACTION, MINIOCR_PROMPTS
from workers.task.prompt_file import PromptSource
from workers.trainer.train_config import TrainConfig


def miniocr_prompts() -> PromptSource:
    """The shipped MiniOCR prompts, their held-out strings apart."""
    return PromptSource.from_file(MINIOCR_PROMPTS, HELDOUT_FRACTION)


def cpu_tiny_ocr(base: TrainConfig) -> TrainConfig:
    """cpu_tiny's NFT recipe (given as `base`) on MiniOCR: 8 prompts x 8 samples an iteration on the OCR reward,
    20 iterations, the held-out strings scored every 5."""
    return dataclasses.replace(base, reward="ocr", prompts=miniocr_prompts(), train_categories=None)


def cpu_tiny_ocr_spot(base: TrainConfig) -> TrainConfig:
    """`spotlight run`'s recipe (cpu_tiny_spot, given as `base`: exploration as a pre-filter, a prompt's group in
    one request) on MiniOCR."""
    return dataclasses.replace(base, reward="ocr", prompts=miniocr_prompts(), train_categories=None)
