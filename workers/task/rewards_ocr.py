"""The OCR reward (`--reward ocr`): flow_grpo's text-rendering score, with PP-OCR read by rapidocr's ONNX models.

The target is the prompt's first quoted text (`a sign that says "OPEN"` -> OPEN), or the prompt's `text` field from a
JSON Lines prompts file when it has one; spaces are removed and both sides lower-cased. With `reading` what OCR reads
(every detected line joined, spaces removed, lower-cased), the distance d is 0 when the target is a substring of the
reading, else the Levenshtein distance between them, capped at the target's length; the reward is 1 - d / len(target)
in [0, 1]. An image OCR cannot process scores 0, as flow_grpo's does.

The models (PP-OCRv6 small detection and recognition, Apache-2.0) ship inside rapidocr's wheel: with the default
language and OCR version nothing downloads. They load on the first call, once per process and thread count.
Images smaller than `min_side_px` are upscaled (bicubic) first: the detector misses glyphs a few pixels high.

Example:
    reward_fn = get_reward("ocr")                      # or "ocr:threads=4"
    scores = reward_fn(images_NHW3, ['"K7P" in red'])  # (N,) float64 in [0, 1]
    readings = ocr_readings(images_NHW3)               # what OCR read, for the report
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from workers.task.reward_inputs import check_reward_batch

_ENGINES: dict[int, Any] = {}
"""Thread count -> the loaded RapidOCR engine (one per process and thread count)."""
_LOAD_LOCK = threading.Lock()


@dataclass(frozen=True)
class OcrRewardConfig:
    threads: int = 1
    """onnxruntime's intra-op threads per model: 1 beside a trainer or a worker that uses the other cores."""
    min_side_px: int = 160
    """Images whose shorter side is under this are upscaled by the smallest integer factor that reaches it."""

    def __post_init__(self):
        if not 1 <= self.threads <= 256:
            raise ValueError(f"threads must be in [1, 256], got {self.threads}")
        if not 1 <= self.min_side_px <= 4096:
            raise ValueError(f"min_side_px must be in [1, 4096], got {self.min_side_px}")


def parse_ocr_spec(arg: str) -> OcrRewardConfig:
    """`threads=N[,min_side_px=N]` (the ARG of `ocr:ARG`) -> config; ValueError if malformed."""
    fields: dict[str, int] = {}
    for option in arg.split(","):
        key, sep, value = option.partition("=")
        if not sep or key not in ("threads", "min_side_px") or not value.isdigit():
            raise ValueError(f"ocr reward option {option!r}: use threads=N or min_side_px=N")
        fields[key] = int(value)
    return OcrRewardConfig(**fields)


def target_text(prompt: str, fields: dict | None = None) -> str:
    """What the image should read: the `text` field, else the prompt's first quoted text; spaces removed,
    lower-cased. ValueError when there is none (the prompt cannot be scored by OCR)."""
    text = (fields or {}).get("text")
    if text is None and prompt.count('"') >= 2:
        text = prompt.split('"')[1]
    target = "" if text is None else str(text).replace(" ", "").lower()
    if not target:
        raise ValueError(
            f"the ocr reward reads its target from a quoted text in the prompt or a `text` field, and {prompt!r:.80} "
            "has neither (or an empty one): quote the text to render, e.g. 'a sign that says \"OPEN\"'"
        )
    return target


def ocr_score(reading: str, target: str) -> float:
    """flow_grpo's reward of one reading: 1 - d / len(target), d = 0 when the target is in the reading, else the
    Levenshtein distance, capped at len(target). Both are compared with spaces removed, lower-cased."""
    from rapidfuzz.distance import Levenshtein

    reading = reading.replace(" ", "").lower()
    target = target.replace(" ", "").lower()
    distance = 0 if target in reading else min(Levenshtein.distance(reading, target), len(target))
    return 1.0 - distance / len(target)


def _engine(threads: int):
    with _LOAD_LOCK:
        if threads not in _ENGINES:
            from rapidocr import RapidOCR

            _ENGINES[threads] = RapidOCR(
                params={
                    # Global.text_score keeps its 0.5: PaddleOCR's drop_score, so lines flow_grpo's reader dropped
                    # are dropped here too.
                    "Global.use_cls": False,  # text is upright here; the angle classifier only costs time
                    "Global.log_level": "error",  # not a warning per blank image
                    "Det.limit_type": "max",
                    "Det.limit_side_len": 960,
                    "EngineConfig.onnxruntime.intra_op_num_threads": threads,
                    "EngineConfig.onnxruntime.inter_op_num_threads": 1,
                }
            )
        return _ENGINES[threads]


def _upscaled(image_HW3: np.ndarray, min_side_px: int) -> np.ndarray:
    factor = math.ceil(min_side_px / min(image_HW3.shape[:2]))
    if factor <= 1:
        return image_HW3
    h, w = image_HW3.shape[:2]
    return np.asarray(Image.fromarray(image_HW3).resize((w * factor, h * factor), Image.Resampling.BICUBIC))


def read_text(image_HW3: np.ndarray, config: OcrRewardConfig = OcrRewardConfig()) -> str:
    """What OCR reads in one RGB uint8 image: its lines in reading order, joined ("" when it finds none)."""
    bgr = np.ascontiguousarray(_upscaled(image_HW3, config.min_side_px)[:, :, ::-1])  # rapidocr takes OpenCV's BGR
    result = _engine(config.threads)(bgr)
    return "".join(result.txts or ())


def _failure_types() -> tuple[type[BaseException], ...]:
    """What an image OCR cannot process raises: OpenCV's errors and rapidocr's (a resize or an ONNX run that
    fails, which rapidocr wraps with onnxruntime's error)."""
    import cv2
    from rapidocr.ch_ppocr_det.utils import ResizeImgError
    from rapidocr.inference_engine.onnxruntime.main import ONNXRuntimeError
    from rapidocr.main import RapidOCRError

    return (cv2.error, ResizeImgError, ONNXRuntimeError, RapidOCRError)


def ocr_readings(images_NHW3: np.ndarray, config: OcrRewardConfig = OcrRewardConfig()) -> list[str | None]:
    """What OCR reads in each image; None where OCR failed on it (such an image scores 0)."""
    failures = _failure_types()
    readings: list[str | None] = []
    for image in images_NHW3:
        try:
            readings.append(read_text(image, config))
        except failures:
            readings.append(None)
    return readings


class OcrReward:
    """The reward callable: (N, H, W, 3) uint8 images, their prompts (and fields) -> (N,) float64 in [0, 1]."""

    def __init__(self, config: OcrRewardConfig = OcrRewardConfig()):
        self.config = config

    def __call__(self, images_NHW3: np.ndarray, prompts: list[str], fields: list[dict] | None = None) -> np.ndarray:
        check_reward_batch(images_NHW3, prompts)
        targets = [target_text(p, f) for p, f in zip(prompts, fields or [None] * len(prompts), strict=True)]
        readings = ocr_readings(images_NHW3, self.config)
        return np.array(
            [0.0 if r is None else ocr_score(r, t) for r, t in zip(readings, targets, strict=True)], dtype=np.float64
        )

    def readings(self, images_NHW3: np.ndarray) -> list[str | None]:
        """What OCR reads in each image (the report prints it under each sample)."""
        return ocr_readings(images_NHW3, self.config)


def ocr_reward(arg: str) -> OcrReward:
    """The `ocr:ARG` kind (`threads=N,min_side_px=N`); loads nothing until the first call."""
    return OcrReward(parse_ocr_spec(arg))
