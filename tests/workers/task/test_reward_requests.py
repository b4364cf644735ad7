"""The server's reading of a scoring request: every size limit is checked from the PNG headers, before decoding."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from PIL import ImageFile

from resources.reward_http import RequestTooLarge
from resources.reward_limits import ImageLimits
from tests.pipelines.reward_clients import recording_loads
from workers.task.reward_requests import read_scoring_request
from workers.task.rewards_remote import encode_png, encode_request

IMAGES = np.random.default_rng(1).integers(0, 256, (3, 12, 10, 3), dtype=np.uint8)
BODY = encode_request(IMAGES, ["a", "b", "c"], [{"text": "x"}, {}, {"n": 1}])


@pytest.fixture
def decoded(monkeypatch) -> list[int]:
    """The widths of the images PIL decodes (ImageFile.load), in order."""
    loads: list[int] = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", recording_loads(real_load, loads))
    return loads


def test_a_request_within_its_limits_is_decoded_with_its_fields(decoded):
    request = read_scoring_request(BODY, ImageLimits(max_images=3, max_pixels=120, max_request_pixels=360))
    np.testing.assert_array_equal(request.images_NHW3, IMAGES)
    assert request.fields == [{"text": "x"}, {}, {"n": 1}] and decoded == [10, 10, 10]


@pytest.mark.parametrize(
    "limits, message",
    [
        (ImageLimits(max_pixels=119), "an image is 10x12 pixels; this server decodes at most 119"),
        (ImageLimits(max_request_pixels=359), r"3 images hold 360 pixels.*at most 359 per request.*\?max_images=2"),
    ],
)
def test_an_image_or_a_request_over_its_pixel_limit_is_refused_before_any_decoding(decoded, limits, message):
    with pytest.raises(RequestTooLarge, match=message):
        read_scoring_request(BODY, limits)
    assert decoded == []


def test_images_of_different_sizes_are_refused_before_any_decoding(decoded):
    mixed = json.dumps({"prompts": ["a", "b"], "images": [encode_png(IMAGES[0]), encode_png(IMAGES[1, :, :5])]})
    with pytest.raises(ValueError, match="share a size"):
        read_scoring_request(mixed, ImageLimits())
    assert decoded == []


def test_decoding_stops_once_the_deadline_has_passed(decoded):
    with pytest.raises(TimeoutError, match="after decoding 0 of 3 images"):
        read_scoring_request(BODY, ImageLimits(), deadline=time.monotonic() - 1)
    assert decoded == []
