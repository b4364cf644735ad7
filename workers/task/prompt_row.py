"""One row of a prompts file: the prompt's text, its other fields (handed to the reward) and where it stands in the
file; `record_row` checks a record (a JSON object, a CSV row, a Parquet row) into one.

A row's `negative_prompt` field, when it has one, is that prompt's negative prompt under true CFG (the run's
model.negative_prompt is the default for rows without one); it must be text.

Example:
    row = record_row({"prompt": "a cat", "negative_prompt": "blurry"}, 3, path, "line")
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMPT_COLUMN = "prompt"
NEGATIVE_PROMPT_FIELD = "negative_prompt"
"""A row's own negative prompt (true CFG); rows without one use the run's model.negative_prompt."""


@dataclass(frozen=True)
class PromptRow:
    text: str
    fields_json: str
    """The row's other fields as a JSON object ("{}" for a text file)."""
    line: int
    """1-based line (text, JSON Lines, CSV), item (a JSON array) or row number (Parquet, datasets)."""


def record_row(record: Any, n: int, path: Path, unit: str) -> PromptRow:
    """The row of a record; ValueError naming the file, the `unit` n and what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"--prompts {path}: {unit} {n} is not a JSON object with a {PROMPT_COLUMN!r} field")
    if PROMPT_COLUMN not in record:
        raise ValueError(f"--prompts {path}: {unit} {n} has no {PROMPT_COLUMN!r} field (it has {sorted(record)[:8]})")
    text = record[PROMPT_COLUMN]
    if not isinstance(text, str):
        raise ValueError(f"--prompts {path}: {unit} {n}: {PROMPT_COLUMN!r} is {type(text).__name__}, not text")
    negative = record.get(NEGATIVE_PROMPT_FIELD)
    if negative is not None and not isinstance(negative, str):
        raise ValueError(
            f"--prompts {path}: {unit} {n}: {NEGATIVE_PROMPT_FIELD!r} is {type(negative).__name__}, not text"
        )
    fields = {k: v for k, v in record.items() if k != PROMPT_COLUMN}
    try:
        fields_json = json.dumps(fields, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as err:
        raise ValueError(f"--prompts {path}: {unit} {n}: its fields are not plain JSON ({err})") from None
    return PromptRow(text.strip(), fields_json, n)


def set_row_negatives(policy, negatives: dict[str, str]) -> None:
    """Give `policy` these prompts' own negative prompts (a diffusers family's `row_negatives`); a policy without
    true CFG (the pixel policy) has none to set and is left as it is."""
    own = getattr(policy, "row_negatives", None)
    if own is not None and negatives:
        own.update(negatives)


def fields_negative(prompt: str, fields: dict[str, Any] | None) -> dict[str, str]:
    """{prompt: its negative prompt} when a request's prompt fields carry one, else {}."""
    negative = (fields or {}).get(NEGATIVE_PROMPT_FIELD)
    return {prompt: negative} if isinstance(negative, str) else {}
