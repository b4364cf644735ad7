"""The check every reward makes of its inputs before any compute: uint8 images (N, H, W, 3), one prompt each."""

from __future__ import annotations

import numpy as np


def check_reward_batch(images_NHW3: np.ndarray, prompts: list[str]) -> None:
    """ValueError saying what is wrong when the images are not uint8 (N, H, W, 3) or the prompts don't match them."""
    if not isinstance(images_NHW3, np.ndarray) or images_NHW3.dtype != np.uint8 or images_NHW3.ndim != 4 \
            or images_NHW3.shape[-1] != 3:
        shape = getattr(images_NHW3, "shape", None)
        dtype = getattr(images_NHW3, "dtype", type(images_NHW3).__name__)
        raise ValueError(f"a reward scores uint8 images of shape (N, H, W, 3), got {dtype} of shape {shape}")
    if len(prompts) != len(images_NHW3) or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"{len(images_NHW3)} images need {len(images_NHW3)} prompt strings, got {len(prompts)}")
