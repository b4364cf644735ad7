"""What every reward is handed: uint8 images (N, H, W, 3), one prompt each, and optionally each prompt's fields from
the prompts file (a reward that declares a `fields` keyword gets them; others are called as before)."""

from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np


def check_reward_batch(images_NHW3: np.ndarray, prompts: list[str]) -> None:
    """ValueError saying what is wrong when the images are not uint8 (N, H, W, 3) or the prompts don't match them."""
    if (
        not isinstance(images_NHW3, np.ndarray)
        or images_NHW3.dtype != np.uint8
        or images_NHW3.ndim != 4
        or images_NHW3.shape[-1] != 3
    ):
        shape = getattr(images_NHW3, "shape", None)
        dtype = getattr(images_NHW3, "dtype", type(images_NHW3).__name__)
        raise ValueError(f"a reward scores uint8 images of shape (N, H, W, 3), got {dtype} of shape {shape}")
    if len(prompts) != len(images_NHW3) or not all(isinstance(p, str) for p in prompts):
        raise ValueError(f"{len(images_NHW3)} images need {len(images_NHW3)} prompt strings, got {len(prompts)}")


def takes_fields(reward_fn: Callable) -> bool:
    """True when the reward declares a `fields` keyword (one dict per image: the prompts file's other columns)."""
    try:
        return "fields" in inspect.signature(reward_fn).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no keyword to pass
        return False


def call_reward(
    reward_fn: Callable, images_NHW3: np.ndarray, prompts: list[str], fields: list[dict[str, Any]] | None = None
):
    """reward_fn(images, prompts), with `fields=` too when fields are given and the reward takes them."""
    if fields is not None and takes_fields(reward_fn):
        if len(fields) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts need {len(prompts)} field dicts, got {len(fields)}")
        return reward_fn(images_NHW3, prompts, fields=fields)
    return reward_fn(images_NHW3, prompts)
