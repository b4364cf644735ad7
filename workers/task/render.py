"""Procedural renderer for MiniGenEval: draws an image that satisfies a prompt's SceneSpec.

Used to make pretraining data and to check that the detector scores ground truth
correctly. Objects are flat-coloured circles, squares and triangles on black, placed at
random without overlap; relations and absolute positions are honoured with a margin
wider than the detector's, so every rendered image is unambiguous.

Example:
    rng = np.random.default_rng(0)
    img_HW3 = render_scene(parse_prompt("two red circles"), rng)   # uint8
"""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image, ImageDraw

from workers.task.prompts import COLORS, SceneSpec

IMAGE_SIZE = 32
MIN_RADIUS, MAX_RADIUS = 4.5, 6.0
GAP_PX = 2.0
EXTENT = 1.42
"""A triangle's vertices reach 1.42 r from its centre; spacing uses it so objects never touch."""
RELATION_MARGIN_PX = 6.0
MAX_TRIES = 400


class RenderError(RuntimeError):
    """The placement search failed (never expected within MiniGenEval's object limit)."""


def _satisfies(spec: SceneSpec, centers: list[tuple[float, float]], size: int) -> bool:
    if spec.relation:
        (x0, y0), (x1, y1) = centers[0], centers[1]
        m = RELATION_MARGIN_PX
        return {"left_of": x0 + m < x1, "right_of": x0 > x1 + m, "above": y0 + m < y1, "below": y0 > y1 + m}[
            spec.relation
        ]
    if spec.position:
        x, y = centers[0]
        half, m = size / 2, RELATION_MARGIN_PX / 2
        return {"left": x < half - m, "right": x > half + m, "top": y < half - m, "bottom": y > half + m}[spec.position]
    return True


def _place(spec: SceneSpec, rng: np.random.Generator, size: int) -> list[tuple[float, float, float]]:
    """Centres and radii for every object, in group order, non-overlapping."""
    n = spec.num_objects
    for _ in range(MAX_TRIES):
        placed: list[tuple[float, float, float]] = []
        for _ in range(n):
            for _ in range(50):
                r = float(rng.uniform(MIN_RADIUS, MAX_RADIUS))
                x, y = (float(v) for v in rng.uniform(EXTENT * r, size - EXTENT * r, size=2))
                if all((x - px) ** 2 + (y - py) ** 2 > (EXTENT * (r + pr) + GAP_PX) ** 2 for px, py, pr in placed):
                    placed.append((x, y, r))
                    break
            else:
                break
        if len(placed) == n and _satisfies(spec, [(x, y) for x, y, _ in placed], size):
            return placed
    raise RenderError(f"could not place {n} objects for {spec}")


def _draw(draw: ImageDraw.ImageDraw, shape: str, x: float, y: float, r: float, rgb) -> None:
    if shape == "circle":
        draw.ellipse([x - r, y - r, x + r, y + r], fill=rgb)
    elif shape == "square":
        s = r * 0.9  # same visual weight as a circle of radius r
        draw.rectangle([x - s, y - s, x + s, y + s], fill=rgb)
    else:
        draw.polygon([(x, y - r * 1.1), (x - r * 1.1, y + r * 0.9), (x + r * 1.1, y + r * 0.9)], fill=rgb)


def render_scene(spec: SceneSpec, rng: np.random.Generator, size: int = IMAGE_SIZE) -> np.ndarray:
    """An RGB uint8 image (size, size, 3) that satisfies spec."""
    image = Image.new("RGB", (size, size), (0, 0, 0))
    draw = ImageDraw.Draw(image)
    objects = iter(_place(spec, rng, size))
    for group in spec.groups:
        for _ in range(group.count):
            x, y, r = next(objects)
            _draw(draw, group.shape, x, y, r, COLORS[group.color])
    return np.asarray(image, dtype=np.uint8)


def to_model_space(images_NHW3: np.ndarray) -> torch.Tensor:
    """uint8 images -> float tensor (N, 3, H, W) in [-1, 1] (the policy's pixel space)."""
    x = torch.from_numpy(np.ascontiguousarray(images_NHW3)).float().div(127.5).sub(1.0)
    return x.permute(0, 3, 1, 2).contiguous()


def to_uint8(images_N3HW: torch.Tensor) -> np.ndarray:
    """Model-space images (N, 3, H, W) in [-1, 1] -> uint8 (N, H, W, 3)."""
    x = images_N3HW.detach().float().clamp(-1, 1).add(1).mul(127.5).round()
    return x.permute(0, 2, 3, 1).to(torch.uint8).cpu().numpy()


def decode_images(policy, samples: torch.Tensor) -> np.ndarray:
    """A policy's final samples -> uint8 images (N, H, W, 3) for the rewards: a diffusers family decodes its
    latents with its VAE (`policy.decode`); the pixel policy's samples already are images."""
    decode = getattr(policy, "decode", None)
    return to_uint8(decode(samples) if callable(decode) else samples)
