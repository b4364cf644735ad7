"""The OCR reward: flow_grpo's formula on images rendered here with known strings, read by the real PP-OCR models."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from workers.task import rewards_ocr
from workers.task.miniocr import OcrSpec, render_text
from workers.task.rewards import get_reward, score_with_components
from workers.task.rewards_ocr import OcrReward, OcrRewardConfig, ocr_score, parse_ocr_spec, target_text


def sign(text: str, width: int = 320, height: int = 96) -> np.ndarray:
    """Black text on white, large: what any OCR reads."""
    image = Image.new("RGB", (width, height), (255, 255, 255))
    ImageDraw.Draw(image).text((16, 20), text, fill=(0, 0, 0), font=ImageFont.load_default(size=44))
    return np.asarray(image, dtype=np.uint8)


@pytest.fixture(scope="module")
def ocr():
    return get_reward("ocr")


def test_exact_text_scores_one(ocr):
    assert ocr(np.stack([sign("OPEN")]), ['a shop sign that says "OPEN"']).tolist() == [1.0]


def test_target_inside_a_longer_reading_scores_one(ocr):
    assert ocr(np.stack([sign("OPEN 24H")]), ['a sign that says "open"']).tolist() == [1.0]


def test_one_wrong_letter_costs_one_over_the_length(ocr):
    assert ocr(np.stack([sign("HELLP")]), ['"HELLO"']).tolist() == [pytest.approx(0.8)]


def test_an_empty_image_scores_zero(ocr):
    blank = np.full((1, 96, 320, 3), 255, dtype=np.uint8)
    assert ocr(blank, ['"OPEN"']).tolist() == [0.0]


def test_a_batch_is_scored_image_by_image_with_the_text_field_first(ocr):
    images = np.stack([sign("OPEN"), sign("CLOSED"), sign("OPEN")])
    prompts = ['"OPEN"', '"OPEN"', "a door sign"]
    fields = [{}, {}, {"text": "open"}]
    totals, parts = score_with_components(ocr, images, prompts, fields)
    assert totals.tolist() == [1.0, 0.0, 1.0]  # "closed" is 4 edits from "open": capped at its 4 letters
    assert parts == {}


def test_the_formula_caps_the_distance_at_the_target_length():
    assert ocr_score("", "open") == 0.0
    assert ocr_score("a completely different reading", "ab") == 0.0
    assert ocr_score("Open Now", "open") == 1.0
    assert ocr_score("opem", "OPEN") == pytest.approx(0.75)


def test_the_target_is_the_quoted_text_without_spaces_lower_cased():
    assert target_text('a poster reading "Hello World" in neon') == "helloworld"
    assert target_text("no quotes here", {"text": "K7 P"}) == "k7p"
    with pytest.raises(ValueError, match="quote the text"):
        target_text("a cat on a mat")


def test_an_image_ocr_cannot_process_scores_zero(monkeypatch):
    from rapidocr.inference_engine.onnxruntime.main import ONNXRuntimeError

    def refuses(image):
        raise ONNXRuntimeError("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : bad input")

    monkeypatch.setitem(rewards_ocr._ENGINES, 3, refuses)
    assert OcrReward(OcrRewardConfig(threads=3))(np.stack([sign("OPEN")]), ['"OPEN"']).tolist() == [0.0]


def test_the_models_load_and_read_with_the_network_refused(monkeypatch):
    def refused(*args, **kwargs):
        raise OSError("network refused by the test")

    monkeypatch.setattr(socket.socket, "connect", refused)
    monkeypatch.setattr(socket.socket, "connect_ex", refused)
    monkeypatch.setattr(rewards_ocr, "_ENGINES", {})  # load the models afresh, offline
    assert get_reward("ocr:threads=2")(np.stack([sign("OPEN")]), ['"OPEN"']).tolist() == [1.0]


def test_miniocr_renderings_at_32_px_are_read(ocr):
    rng = np.random.default_rng(0)
    specs = [OcrSpec("K7", "regular", "red"), OcrSpec("4HX", "bold", "yellow"), OcrSpec("P9T", "regular", "white")]
    images = np.stack([render_text(s, rng) for s in specs])
    assert ocr(images, [f'"{s.text}"' for s in specs]).tolist() == [1.0, 1.0, 1.0]


def test_ocr_specs_name_their_thread_count_or_fail():
    assert parse_ocr_spec("threads=4").threads == 4
    assert parse_ocr_spec("threads=2,min_side_px=96") == OcrRewardConfig(threads=2, min_side_px=96)
    with pytest.raises(ValueError, match="threads=N"):
        get_reward("ocr:workers=2")
    with pytest.raises(ValueError, match="threads must be"):
        parse_ocr_spec("threads=0")
