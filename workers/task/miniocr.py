"""MiniOCR, the tiny model's text-rendering task: prompts that ask for a short string, their words, and a renderer.

A prompt names a string of 2-4 characters (digits and capitals that PP-OCR does not confuse with one another), a
style and a colour: `"K7P" in red`, `"2HX" in bold yellow`. The string is quoted, so the OCR reward
(`workers/task/rewards_ocr.py`, flow_grpo's formula) reads its target from the prompt as it would from any prompt.
The task's prompts are a shipped JSON Lines file (`MINIOCR_PROMPTS`, one prompt per string, its `text` field the
string): a run reads it as a `--prompts` file whose held-out share, picked by a hash of each prompt, holds strings
that pretraining and RL never see.

Example:
    spec = parse_ocr_prompt('"K7P" in bold red')   # OcrSpec(text='K7P', style='bold', color='red')
    img_HW3 = render_text(spec, np.random.default_rng(0))
    ids, lengths = tokenize_ocr(['"K7P" in bold red'])
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

ALPHABET = "234789AEFHKLNPRTXY"
"""Digits and capitals PP-OCR keeps apart at this size: none of 0/O/D/Q/C, 1/I/J, 5/S/6/G, Z, B, U/V/W, M.
Cleanly rendered, PP-OCR reads about 9 in 10 strings exactly (docs/BENCHMARKS.md, "MiniOCR")."""
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (240, 60, 60),
    "green": (60, 210, 80),
    "blue": (80, 130, 255),
    "yellow": (240, 220, 50),
    "white": (240, 240, 240),
}
STYLES = ("regular", "bold")
"""regular: plain glyphs; bold: each glyph stroked one pixel wider (PIL's stroke)."""
MIN_CHARS, MAX_CHARS = 2, 4
IMAGE_SIZE = 32
FONT_PX = (13, 12, 11, 10, 9)
"""Pillow's built-in font, at the largest of these sizes whose text fits the canvas less 2 px a side (13 px for
two or three characters, smaller for four of the wide ones)."""
MAX_TOKENS = 10
"""The tiny text encoder's positions: up to 4 characters, "in", a style and a colour fit."""
VOCAB: tuple[str, ...] = ("<pad>", *ALPHABET, "in", "bold", *COLORS)
MINIOCR_PROMPTS = Path(__file__).parent / "data" / "miniocr_prompts.jsonl"
"""The shipped prompts, one per string (written by `write_prompts`; a test checks it matches)."""
NUM_PROMPTS = 1536
HELDOUT_FRACTION = 0.05
"""Share of the prompts held out for validation (about 77 strings), by a hash of the prompt (prompt_file.py)."""


@dataclass(frozen=True)
class OcrSpec:
    text: str
    """The string to render (2-4 characters of ALPHABET)."""
    style: str
    color: str


class OcrPromptError(ValueError):
    """A prompt outside MiniOCR's grammar."""


def ocr_prompt_text(spec: OcrSpec) -> str:
    """The canonical prompt of a spec (parse_ocr_prompt(ocr_prompt_text(s)) == s)."""
    style = "bold " if spec.style == "bold" else ""
    return f'"{spec.text}" in {style}{spec.color}'


def parse_ocr_prompt(prompt: str) -> OcrSpec:
    """The spec of a MiniOCR prompt; OcrPromptError (a ValueError) says what is outside the grammar."""
    _, quote, rest = prompt.strip().partition('"')
    text, close, tail = rest.partition('"')
    if not quote or not close or prompt.strip()[0] != '"':
        raise OcrPromptError(f"{prompt!r}: a MiniOCR prompt starts with the quoted string, e.g. '\"K7P\" in red'")
    if not MIN_CHARS <= len(text) <= MAX_CHARS or any(c not in ALPHABET for c in text):
        raise OcrPromptError(f"{prompt!r}: the string must be {MIN_CHARS}-{MAX_CHARS} characters of {ALPHABET}")
    words = tail.split()
    if not words or words[0] != "in" or len(words) not in (2, 3) or (len(words) == 3 and words[1] != "bold"):
        raise OcrPromptError(f"{prompt!r}: after the string comes 'in [bold] COLOUR'")
    if words[-1] not in COLORS:
        raise OcrPromptError(f"{prompt!r}: {words[-1]!r} is not a colour; use one of {sorted(COLORS)}")
    return OcrSpec(text, "bold" if len(words) == 3 else "regular", words[-1])


def is_ocr_prompt(prompt: str) -> bool:
    try:
        parse_ocr_prompt(prompt)
    except OcrPromptError:
        return False
    return True


def tokenize_ocr(prompts: list[str]) -> tuple[list[list[int]], list[int]]:
    """Token ids (one per character, then "in", the style and the colour; padded to MAX_TOKENS) and lengths."""
    index = {w: i for i, w in enumerate(VOCAB)}
    ids, lengths = [], []
    for prompt in prompts:
        spec = parse_ocr_prompt(prompt)
        tokens = [*spec.text, "in", *(["bold"] if spec.style == "bold" else []), spec.color]
        ids.append([index[t] for t in tokens] + [0] * (MAX_TOKENS - len(tokens)))
        lengths.append(len(tokens))
    return ids, lengths


@functools.lru_cache(maxsize=8)
def _font(px: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=px)


def _fitted(draw: ImageDraw.ImageDraw, text: str, stroke: int, size: int):
    for px in FONT_PX:
        box = draw.textbbox((0, 0), text, font=_font(px), stroke_width=stroke)
        if box[2] - box[0] <= size - 4:
            break
    return _font(px), box


def render_text(spec: OcrSpec, rng: np.random.Generator, size: int = IMAGE_SIZE) -> np.ndarray:
    """An RGB uint8 image (size, size, 3): the string in its colour and style on black, centred, jittered by up to
    two pixels (less where the text would leave the canvas)."""
    image = Image.new("RGB", (size, size), (0, 0, 0))
    draw = ImageDraw.Draw(image)
    stroke = 1 if spec.style == "bold" else 0
    font, (left, top, right, bottom) = _fitted(draw, spec.text, stroke, size)
    slack_x, slack_y = (max(0.0, min(2.0, (size - extent) / 2 - 1)) for extent in (right - left, bottom - top))
    x = (size - (right - left)) / 2 - left + float(rng.uniform(-slack_x, slack_x))
    y = (size - (bottom - top)) / 2 - top + float(rng.uniform(-slack_y, slack_y))
    rgb = COLORS[spec.color]
    draw.text((x, y), spec.text, fill=rgb, font=font, stroke_width=stroke, stroke_fill=rgb)
    return np.asarray(image, dtype=np.uint8)


def prompt_rows(num_prompts: int = NUM_PROMPTS, seed: int = 0) -> list[dict[str, str]]:
    """The task's prompts, one per distinct string: {"prompt": ..., "text": the string}; fixed by `seed`."""
    rng = np.random.default_rng(seed)
    rows, seen = [], set()
    while len(rows) < num_prompts:
        length = int(rng.integers(MIN_CHARS, MAX_CHARS + 1))
        text = "".join(ALPHABET[i] for i in rng.integers(len(ALPHABET), size=length))
        if text in seen:
            continue
        seen.add(text)
        spec = OcrSpec(text, STYLES[rng.integers(len(STYLES))], list(COLORS)[rng.integers(len(COLORS))])
        rows.append({"prompt": ocr_prompt_text(spec), "text": text})
    return rows


def write_prompts(path: Path = MINIOCR_PROMPTS) -> None:
    """Write the shipped prompts file (`prompt_rows`, one JSON object a line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in prompt_rows()))
