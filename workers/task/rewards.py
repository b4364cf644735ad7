"""Reward functions and their registry: name -> callable on a batch of images and prompts.

A reward takes uint8 images (N, H, W, 3) and their prompts and returns N floats. Users
add their own with `register_reward("name", fn)`; configs name rewards by string and
an unknown name fails when the config is built, before any compute.

Example:
    reward_fn = get_reward("minigeneval")
    rewards = reward_fn(images_NHW3, prompts)   # np.ndarray (N,)
"""

from __future__ import annotations

import io
from typing import Callable

import numpy as np
from PIL import Image

from workers.task.detect import score_images

RewardFn = Callable[[np.ndarray, list[str]], np.ndarray]
_REGISTRY: dict[str, RewardFn] = {}


def register_reward(name: str, fn: RewardFn) -> None:
    """Add a reward under `name` (replacing one of the same name)."""
    if not name or not name.replace("_", "").isalnum():
        raise ValueError(f"reward name {name!r}: use letters, digits and underscores")
    _REGISTRY[name] = fn


def get_reward(name: str) -> RewardFn:
    if name not in _REGISTRY:
        raise ValueError(f"unknown reward {name!r}; registered rewards: {sorted(_REGISTRY)}")
    return _REGISTRY[name]


def reward_names() -> list[str]:
    return sorted(_REGISTRY)


def minigeneval_partial(images_NHW3: np.ndarray, prompts: list[str]) -> np.ndarray:
    """Share of the prompt's criteria the image satisfies (dense: the default training reward)."""
    return np.array([s.partial for s in score_images(images_NHW3, prompts)], dtype=np.float64)


def minigeneval_strict(images_NHW3: np.ndarray, prompts: list[str]) -> np.ndarray:
    """1 when every criterion passes, else 0 (GenEval's per-image correctness)."""
    return np.array([s.strict for s in score_images(images_NHW3, prompts)], dtype=np.float64)


def jpeg_compressibility(images_NHW3: np.ndarray, prompts: list[str]) -> np.ndarray:
    """DDPO's compressibility reward: minus the JPEG size (quality 95) in kilobytes."""
    sizes = []
    for img in images_NHW3:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=95)
        sizes.append(buf.tell() / 1000.0)
    return -np.array(sizes, dtype=np.float64)


register_reward("minigeneval", minigeneval_partial)
register_reward("minigeneval_strict", minigeneval_strict)
register_reward("jpeg_compressibility", jpeg_compressibility)
