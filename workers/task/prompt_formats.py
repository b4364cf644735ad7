"""The row readers of a prompts file's text formats (workers/task/prompt_file.py): plain text, JSON Lines, a JSON
array and CSV / TSV. Each returns `PromptRow`s numbered as the user sees the file, or raises ValueError naming the
file, the line and what is wrong.

Comments: only a plain-text file has them. There a line whose first non-blank character is `#` is a comment and is
skipped, and the number skipped is logged; a prompt that starts with `#` is written `\\#...` (the backslash is
dropped). JSON Lines skips blank lines only: a `#` line is not JSON and is refused like any other bad line.

Example:
    rows, comments = text_rows("a red cube\\n# skipped\\n\\\\#hashtag prompt\\n")   # 2 rows, 1 comment
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any, Callable

from workers.task.prompt_row import PROMPT_COLUMN, PromptRow, record_row

STRUCTURED_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")
"""The suffixes read as records with a "prompt" field; any other text file is one prompt a line."""
REFUSED_SUFFIXES = (".yaml", ".yml", ".xml", ".xlsx", ".xls", ".gz", ".zip", ".tar", ".pkl", ".pickle", ".npy")
"""Suffixes of formats a prompts file is not read as (not as lines of text either)."""


def text_rows(text: str) -> tuple[list[PromptRow], int]:
    """(one row per non-blank, non-comment line, the number of comment lines skipped)."""
    rows, comments = [], 0
    for n, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            comments += 1
            continue
        rows.append(PromptRow(stripped[1:] if stripped.startswith("\\#") else stripped, "{}", n))
    return rows, comments


def jsonl_rows(text: str, path: Path) -> list[PromptRow]:
    """One JSON object a line ({"prompt": ..., other fields}); blank lines skipped."""
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"--prompts {path}: line {n} is not JSON ({err.msg})") from None
        rows.append(record_row(record, n, path, "line"))
    return rows


def json_rows(text: str, path: Path) -> list[PromptRow]:
    """A JSON array of objects ({"prompt": ..., other fields}) or of prompt strings; rows numbered from 1."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"--prompts {path}: not JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(data, list):
        raise ValueError(
            f'--prompts {path}: a .json prompts file holds an array of {{"{PROMPT_COLUMN}": ...}} objects or of '
            f"strings, not a {type(data).__name__}; for one object a line, name the file .jsonl"
        )
    return [record_row({PROMPT_COLUMN: r} if isinstance(r, str) else r, n, path, "item") for n, r in enumerate(data, 1)]


def csv_rows(text: str, path: Path, delimiter: str = ",") -> list[PromptRow]:
    """A header row naming a "prompt" column, then one prompt a row; the other columns are its fields (text; an
    empty cell is no field). Rows are numbered by the line they start on."""
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter, strict=True)
    try:
        header = reader.fieldnames or []
        if PROMPT_COLUMN not in header:
            raise ValueError(
                f"--prompts {path}: the header row names no {PROMPT_COLUMN!r} column (it names {header[:8]}); the "
                f"first row must be the column names, one of them {PROMPT_COLUMN!r}"
            )
        rows = []
        line = reader.line_num + 1
        for record in reader:
            if None in record or any(v is None for v in record.values()):
                raise ValueError(f"--prompts {path}: line {line} has not the header's {len(header)} columns")
            rows.append(record_row(_present(record), line, path, "line"))
            line = reader.line_num + 1
        return rows
    except csv.Error as err:
        raise ValueError(f"--prompts {path}: not valid CSV near line {reader.line_num} ({err})") from None


def _present(record: dict[str, Any]) -> dict[str, Any]:
    """The record without its empty cells (an empty negative_prompt cell means none)."""
    return {k: v for k, v in record.items() if k == PROMPT_COLUMN or v != ""}


READERS: dict[str, Callable[[str, Path], list[PromptRow]]] = {
    ".jsonl": jsonl_rows,
    ".json": json_rows,
    ".csv": csv_rows,
    ".tsv": lambda text, path: csv_rows(text, path, "\t"),
}
"""Structured text formats by suffix."""
