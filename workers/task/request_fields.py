"""The checks every request (rollout or exploration) makes of what it names, before any compute."""

from __future__ import annotations

import json
from typing import Any

from resources.keys import check_name
from workers.task.miniocr import parse_ocr_prompt
from workers.task.prompts import parse_prompt
from workers.task.rewards import get_reward

MAX_PROMPT_CHARS = 10_000


def check_request_fields(run: str, prompt: str, weights_version: int, reward: str) -> None:
    """ValueError naming the field when the run name, the prompt, the weights version or the reward is unusable.
    A prompt is any non-empty text here: a diffusers pipeline reads free text, and the pixel policy refuses a prompt
    outside MiniGenEval's words when the worker has its weights, before sampling (`check_policy_reads`)."""
    check_name(run, "run name")
    if isinstance(weights_version, bool) or not isinstance(weights_version, int) or weights_version < 0:
        raise ValueError(f"weights_version must be an int >= 0, got {weights_version!r}")
    if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > MAX_PROMPT_CHARS:
        raise ValueError(f"prompt must be non-empty text of at most {MAX_PROMPT_CHARS} characters, got {prompt!r:.80}")
    get_reward(reward)


def check_prompt_fields(fields: Any) -> None:
    """ValueError unless `fields` is None or a JSON object (a prompts file's other fields, for the reward)."""
    if fields is None:
        return
    if not isinstance(fields, dict):
        raise ValueError(f"prompt_fields must be a JSON object, got {type(fields).__name__}")
    try:
        json.dumps(fields, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"prompt_fields must be plain JSON: {err}") from None


def check_policy_reads(policy, prompt: str) -> None:
    """ValueError when the pixel policy (no `at`: it knows only its task's words, MiniGenEval's or MiniOCR's) is asked
    for a prompt outside its task's grammar; a diffusers pipeline reads any text."""
    if hasattr(policy, "at"):
        return
    if getattr(getattr(policy, "config", None), "task", "minigeneval") == "miniocr":
        parse_ocr_prompt(prompt)  # OcrPromptError (a ValueError) says what is outside the grammar
        return
    parse_prompt(prompt)  # PromptError (a ValueError) names the unknown words
