"""Cheap statistics of a batch of held-out images, the signs of a reward being gamed: flat, washed-out, blank
or identical images.

Each function takes uint8 images (N, H, W, 3) and returns N floats (diversity: one per prompt). Hacked
text-to-image runs lose edges and colours while the training reward climbs (an OCR-only reward with no KL
cut edge density by 60 % and colour entropy by 54 % over 100 rollouts); a compressibility reward flattens
the image; a collapsed policy draws the same image for every seed. The validate phase averages these over
the held-out images and compares them with the base's (workers/coordinator/hacking_guard.py).

Example:
    stats = image_statistics(images_NHW3, seeds_per_prompt=2)
    stats["edge_density"], stats["colour_entropy"], stats["saturation"], stats["compressed_bytes"], stats["diversity"]
"""

from __future__ import annotations

import zlib

import numpy as np

STATISTICS = ("edge_density", "colour_entropy", "saturation", "compressed_bytes", "diversity")
"""The statistics `image_statistics` returns, in the ledger's column order."""
EDGE_THRESHOLD = 32.0
"""A pixel is an edge where the grey level's finite-difference gradient magnitude exceeds this (0-255 scale)."""
COLOUR_BITS = 3
"""Bits kept per channel for the colour histogram: 512 colours, enough bins for a 32x32 image to fill."""


def _check(images_NHW3: np.ndarray) -> np.ndarray:
    if images_NHW3.ndim != 4 or images_NHW3.shape[-1] != 3 or images_NHW3.dtype != np.uint8 or not len(images_NHW3):
        raise ValueError(f"expected uint8 images (N, H, W, 3) with N >= 1, got {images_NHW3.dtype} {images_NHW3.shape}")
    return images_NHW3


def edge_density(images_NHW3: np.ndarray) -> np.ndarray:
    """(N,) share of each image's pixels on an edge (grey gradient magnitude above EDGE_THRESHOLD)."""
    grey = _check(images_NHW3).astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)  # (N, H, W)
    dx = np.abs(np.diff(grey, axis=2))[:, :-1, :]
    dy = np.abs(np.diff(grey, axis=1))[:, :, :-1]
    return (np.hypot(dx, dy) > EDGE_THRESHOLD).mean(axis=(1, 2)).astype(np.float64)


def colour_entropy(images_NHW3: np.ndarray) -> np.ndarray:
    """(N,) Shannon entropy in bits of each image's histogram of colours quantised to COLOUR_BITS per channel."""
    q = (_check(images_NHW3) >> (8 - COLOUR_BITS)).astype(np.int64)
    codes = (q[..., 0] << (2 * COLOUR_BITS)) | (q[..., 1] << COLOUR_BITS) | q[..., 2]  # (N, H, W)
    out = np.empty(len(codes))
    for i, image in enumerate(codes):
        p = np.bincount(image.ravel(), minlength=1 << (3 * COLOUR_BITS)) / image.size
        p = p[p > 0]
        out[i] = float(-(p * np.log2(p)).sum())
    return out


def saturation(images_NHW3: np.ndarray) -> np.ndarray:
    """(N,) mean chroma, (max - min) / 255 over the channels, of each image's pixels: 0 for grey, 1 for pure
    colours. Chroma rather than HSV's (max - min) / max, which swings from 0 to 1 on nearly black pixels."""
    rgb = _check(images_NHW3).astype(np.float32)
    return ((rgb.max(axis=-1) - rgb.min(axis=-1)) / 255.0).mean(axis=(1, 2)).astype(np.float64)


def compressed_bytes(images_NHW3: np.ndarray) -> np.ndarray:
    """(N,) bytes of each image's raw pixels after zlib (level 6): the detail left in it. Lossless on purpose,
    so that a JPEG-size reward cannot game it by matching JPEG's blocks."""
    return np.array(
        [len(zlib.compress(np.ascontiguousarray(im).tobytes(), 6)) for im in _check(images_NHW3)], dtype=np.float64
    )


def diversity(images_NHW3: np.ndarray, seeds_per_prompt: int) -> np.ndarray:
    """(P,) mean RMS pixel distance (0-1) between the images of each prompt's seeds: 0 when every seed draws the
    same image. Images are prompt-major, `seeds_per_prompt` consecutive images per prompt; NaN with one seed."""
    images = _check(images_NHW3)
    if seeds_per_prompt < 1 or len(images) % seeds_per_prompt:
        raise ValueError(f"{len(images)} images do not split into groups of seeds_per_prompt={seeds_per_prompt}")
    groups = images.reshape(len(images) // seeds_per_prompt, seeds_per_prompt, -1).astype(np.float32) / 255.0
    if seeds_per_prompt == 1:
        return np.full(len(groups), np.nan)
    diff = groups[:, :, None, :] - groups[:, None, :, :]  # (P, S, S, D)
    rms = np.sqrt((diff**2).mean(axis=-1))
    pairs = seeds_per_prompt * (seeds_per_prompt - 1)
    return (rms.sum(axis=(1, 2)) / pairs).astype(np.float64)


def image_statistics(images_NHW3: np.ndarray, seeds_per_prompt: int) -> dict[str, float]:
    """The mean of each statistic in STATISTICS over the images (diversity: over prompts; NaN with one seed)."""
    per_image = {
        "edge_density": edge_density(images_NHW3),
        "colour_entropy": colour_entropy(images_NHW3),
        "saturation": saturation(images_NHW3),
        "compressed_bytes": compressed_bytes(images_NHW3),
        "diversity": diversity(images_NHW3, seeds_per_prompt),
    }
    return {name: float(np.mean(per_image[name])) for name in STATISTICS}
