"""Image statistics of the reward-hacking guard: each one falls when an image goes the way a gamed reward pushes it."""

import numpy as np
import pytest

from workers.task.image_stats import (
    colour_entropy,
    compressed_bytes,
    diversity,
    edge_density,
    image_statistics,
    saturation,
)
from workers.task.prompts import parse_prompt
from workers.task.render import render_scene
from workers.task.rewards import jpeg_compressibility

PROMPTS = ["three red circles", "two blue squares", "a green triangle above a yellow circle"]


def _scenes(seed=0):
    rng = np.random.default_rng(seed)
    return np.stack([render_scene(parse_prompt(p), rng) for p in PROMPTS])


def _flattened(images):
    """What a compressibility reward drives images to: every pixel the image's mean colour."""
    return np.broadcast_to(images.mean(axis=(1, 2), keepdims=True), images.shape).round().astype(np.uint8)


def test_a_flattened_image_loses_edges_colours_detail_and_scores_higher_on_jpeg_size():
    scenes, flat = _scenes(), _flattened(_scenes())
    assert (edge_density(scenes) > 0.01).all() and (edge_density(flat) == 0).all()
    assert (colour_entropy(scenes) > 0.2).all() and (colour_entropy(flat) == 0).all()
    assert (compressed_bytes(flat) < compressed_bytes(scenes)).all()
    assert (jpeg_compressibility(flat, PROMPTS) > jpeg_compressibility(scenes, PROMPTS)).all()  # the hack pays


def test_saturation_is_zero_for_grey_one_for_pure_colours_and_steady_on_dark_pixels():
    grey = np.full((1, 8, 8, 3), 128, np.uint8)
    red = np.zeros((1, 8, 8, 3), np.uint8)
    red[..., 0] = 255
    dark = np.zeros((1, 8, 8, 3), np.uint8)
    dark[..., 0] = 2  # HSV saturation 1 on a nearly black pixel; chroma barely above 0
    assert saturation(grey)[0] == 0 and saturation(red)[0] == 1 and saturation(dark)[0] < 0.01


def test_diversity_is_zero_when_every_seed_draws_the_same_image():
    a, b = _scenes(0), _scenes(1)
    distinct = np.stack([a, b], axis=1).reshape(-1, *a.shape[1:])  # prompt-major: (a0, b0, a1, b1, ...)
    same = np.repeat(a, 2, axis=0)
    assert (diversity(distinct, 2) > 0.05).all() and (diversity(same, 2) == 0).all()
    assert np.isnan(diversity(a, 1)).all()
    with pytest.raises(ValueError, match="groups of seeds_per_prompt=2"):
        diversity(a, 2)


def test_image_statistics_averages_each_statistic_and_refuses_non_images():
    stats = image_statistics(_scenes(), 1)
    assert set(stats) == {"edge_density", "colour_entropy", "saturation", "compressed_bytes", "diversity"}
    assert stats["edge_density"] == pytest.approx(edge_density(_scenes()).mean())
    with pytest.raises(ValueError, match="uint8 images"):
        image_statistics(_scenes().astype(np.float32), 1)
