"""The reward server's side of the wire format: a scoring request checked against its limits before decoding.

A PNG says its width and height in its header, so every image's size, the request's total and whether the images
share a size are known from a few bytes each: a request over a limit is refused before decoding starts (a PNG of
50 KB can decode to 48 MiB, and 256 of them to 12 GiB). Only then are the pixels decoded, straight into one array.

Example:
    limits = ImageLimits(max_images=256, max_pixels=4096 * 4096, max_request_pixels=1 << 26)
    request = read_scoring_request(body, limits, deadline=time.monotonic() + 30)
    request.images_NHW3, request.prompts, request.fields
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import time
from dataclasses import dataclass

import numpy as np
from PIL import Image

from resources.reward_http import RequestTooLarge
from resources.reward_limits import ImageLimits


@dataclass(frozen=True)
class ScoringRequest:
    images_NHW3: np.ndarray
    """(N, H, W, 3) uint8, in the request's order."""
    prompts: list[str]
    fields: list[dict] | None
    """Each prompt's other fields (from a prompts file), or None when the request sends none."""


def read_scoring_request(body: bytes, limits: ImageLimits, deadline: float | None = None) -> ScoringRequest:
    """The request's images, prompts and fields. ValueError if it is malformed, RequestTooLarge (a ValueError) if a
    PNG header says it is over `limits`; TimeoutError if time.monotonic() passes `deadline` while decoding."""
    texts, prompts, fields = _parse(body, limits.max_images)
    headers = [_open_header(text) for text in texts]
    try:
        _check_sizes(headers, limits)
        return ScoringRequest(_decode_all(headers, deadline), prompts, fields)
    finally:
        for image in headers:
            image.close()


def decode_png(text: str, max_pixels: int = ImageLimits.max_pixels) -> np.ndarray:
    """(H, W, 3) uint8 from one base64 PNG; ValueError if it is not one, RequestTooLarge if its header says it has
    more than `max_pixels` pixels (checked before decoding)."""
    with _open_header(text) as image:
        _check_sizes([image], ImageLimits(max_pixels=max_pixels, max_request_pixels=max_pixels))
        return _decode_all([image], None)[0]


def _parse(body: bytes, max_images: int) -> tuple[list[str], list[str], list[dict] | None]:
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"the request body is not JSON: {err}") from None
    if (
        not isinstance(request, dict)
        or not isinstance(request.get("images"), list)
        or not isinstance(request.get("prompts"), list)
    ):
        raise ValueError('the request must be {"prompts": [str], "images": [base64 PNG]}')
    images, prompts = request["images"], request["prompts"]
    if not 1 <= len(images) <= max_images or len(prompts) != len(images):
        raise ValueError(
            f"{len(images)} images and {len(prompts)} prompts: send 1 to {max_images} of each, one prompt per image"
        )
    if not all(isinstance(p, str) for p in prompts) or not all(isinstance(i, str) for i in images):
        raise ValueError("prompts and images must be strings")
    fields = request.get("fields")
    if fields is not None and (
        not isinstance(fields, list) or len(fields) != len(prompts) or not all(isinstance(f, dict) for f in fields)
    ):
        raise ValueError('"fields", when sent, must be one JSON object per prompt')
    return images, prompts, fields


def _open_header(text: str) -> Image.Image:
    """The PNG behind one base64 string, opened lazily: PIL reads its header, not its pixels."""
    try:
        return Image.open(io.BytesIO(base64.b64decode(text, validate=True)), formats=["PNG"])
    except Image.DecompressionBombError as err:  # over PIL's own limit, which is far above the server's default
        raise RequestTooLarge(f"an image is too large to decode: {err}") from None
    except (ValueError, OSError, binascii.Error) as err:
        raise ValueError(f"an image is not a base64 PNG: {err}") from None


def _check_sizes(headers: list[Image.Image], limits: ImageLimits) -> None:
    """RequestTooLarge for an image or a request over its pixel limit, ValueError for images of different sizes."""
    for image in headers:
        if image.width * image.height > limits.max_pixels:
            raise RequestTooLarge(
                f"an image is {image.width}x{image.height} pixels; this server decodes at most {limits.max_pixels} "
                "pixels per image (send smaller images, or start it with a larger --max-pixels)"
            )
    total = sum(image.width * image.height for image in headers)
    if total > limits.max_request_pixels:
        fits = max(1, limits.max_request_pixels // max(image.width * image.height for image in headers))
        raise RequestTooLarge(
            f"the request's {len(headers)} images hold {total} pixels; this server decodes at most "
            f"{limits.max_request_pixels} per request (send at most {fits} such images per request: ?max_images={fits} "
            "on the client, or start the server with a larger --max-request-pixels)"
        )
    sizes = sorted({image.size for image in headers})
    if len(sizes) != 1:
        raise ValueError(f"the images of one request must share a size (width, height), got {sizes}")


def _decode_all(headers: list[Image.Image], deadline: float | None) -> np.ndarray:
    """Decode each image into one preallocated (N, H, W, 3) array: peak memory is the batch plus one image."""
    width, height = headers[0].size
    out_NHW3 = np.empty((len(headers), height, width, 3), dtype=np.uint8)
    for i, image in enumerate(headers):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"the request's deadline passed after decoding {i} of {len(headers)} images")
        try:
            out_NHW3[i] = np.asarray(image.convert("RGB"), dtype=np.uint8)
        except (ValueError, OSError, Image.DecompressionBombError) as err:
            raise ValueError(f"an image is not a base64 PNG: {err}") from None
    return out_NHW3
