r"""A user's training prompts from a file (`--prompts FILE`), read and checked before any weights load, and drawn per
iteration deterministically by the run seed.

Formats, by what the path is:
- a `.jsonl` file: one JSON object a line (blank lines skipped) with a "prompt" string; its other fields
  travel with the prompt to the reward (a reference text for OCR, metadata for GenEval-style checks):
  `prompt_fields`;
- a `.json` file: an array of such objects (or of prompt strings); a `.csv` / `.tsv` file: a header row with a
  "prompt" column, the other columns as fields (workers/task/prompt_formats.py);
- a `.parquet` file, or a folder written by Hugging Face `datasets`' `save_to_disk`: a "prompt" column, the other
  columns as fields (these need pyarrow, or datasets, installed; without them the file is refused, saying so);
- a file of another structured format (.yaml, .xml, .xlsx, archives...) is refused, never read as lines;
- any other file: UTF-8 text, one prompt a line; blank lines are skipped, a line starting with # is a comment
  (skipped, and the count logged), and `\#` starts a prompt with #.

A row's `negative_prompt` field is that prompt's own negative prompt under true CFG (`negative_prompts`); the run's
model.negative_prompt stays the default of the rows without one.

A share of the prompts can be held out for validation (`heldout_fraction`): each prompt goes to one side by a fixed
hash of its text, so the split does not depend on the run seed or on the file's order. Training draws walk the
training side in epochs, each a permutation fixed by (run seed, epoch): every prompt is drawn once per epoch.

Example:
    source = PromptSource.from_file("prompts.jsonl", heldout_fraction=0.1)   # ValueError with the line number
    prompts = draw_prompts(source, seed=0, iteration=3, num_prompts=8)
    fields = prompt_fields(source, prompts[0])                               # {"reference": "OPEN"} or {}
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workers.algo.seeds import domain_seed
from workers.task.prompt_formats import READERS, REFUSED_SUFFIXES, text_rows
from workers.task.prompt_row import NEGATIVE_PROMPT_FIELD, PROMPT_COLUMN, PromptRow, record_row
from workers.task.prompts import iteration_prompts

MAX_PROMPT_CHARS = 10_000
"""A prompt longer than this is refused whatever the model (the text encoders take far fewer tokens)."""
MAX_PROMPTS = 10_000_000
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PromptTable:
    """A prompts file's rows, split into training and held-out prompts."""

    train: tuple[str, ...]
    heldout: tuple[str, ...]
    fields: dict[str, str]
    """Prompt -> its fields as a JSON object (only prompts that have some)."""
    rows: tuple[PromptRow, ...]


@dataclass(frozen=True)
class PromptSource:
    """Where a run's training prompts come from: what a TrainConfig holds (small; the rows are read on demand)."""

    path: str
    """The file or folder, absolute."""
    digest: str
    """blake2b of its bytes: a run whose file changed under it is refused rather than silently redrawn."""
    heldout_fraction: float = 0.0
    """Share of the prompts held out for validation (by a fixed hash of each prompt's text); 0 = none."""

    def __post_init__(self):
        if not 0 <= self.heldout_fraction < 1:
            raise ValueError(f"heldout_fraction must be in [0, 1), got {self.heldout_fraction}")
        if not Path(self.path).is_absolute():
            raise ValueError(f"PromptSource.path must be absolute, got {self.path!r}")

    @classmethod
    def from_file(cls, path: str | Path, heldout_fraction: float = 0.0) -> "PromptSource":
        """Read and check the file now (ValueError naming the file, the line and what is wrong)."""
        path = Path(path).expanduser().resolve()
        source = cls(str(path), file_digest(path), heldout_fraction)
        load_table(source)
        return source

    def table(self) -> PromptTable:
        return load_table(self)


def file_digest(path: Path) -> str:
    if not path.exists():
        raise ValueError(f"--prompts {path}: no such file or folder")
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    digest = hashlib.blake2b(digest_size=16)
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=4)
def load_table(source: PromptSource) -> PromptTable:
    """The source's rows, read once per process; ValueError if the file changed since the run recorded it."""
    path = Path(source.path)
    if file_digest(path) != source.digest:
        raise ValueError(
            f"--prompts {path} changed since the run started (its digest differs); restore it, or "
            "start a new run on the new file"
        )
    rows = read_rows(path)
    fields = check_rows(rows, path)
    train, heldout = split_heldout(tuple(r.text for r in rows), source.heldout_fraction, path)
    return PromptTable(train, heldout, fields, rows)


def read_rows(path: Path) -> list[PromptRow]:
    """The file's rows by its format (the module docstring); a plain-text file's skipped comment lines are logged."""
    if path.is_dir():
        return _dataset_rows(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return _parquet_rows(path)
    if suffix in REFUSED_SUFFIXES:
        raise ValueError(
            f"--prompts {path}: a {suffix} file is not a prompts format; give .txt (one prompt a line), .jsonl, "
            f'.json (an array of {{"{PROMPT_COLUMN}": ...}}), .csv / .tsv (a "{PROMPT_COLUMN}" column), .parquet or '
            "a Hugging Face datasets folder"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--prompts {path}: cannot read it as UTF-8 text ({err})") from None
    if suffix in READERS:
        return READERS[suffix](text, path)
    rows, comments = text_rows(text)
    if comments:
        _log.warning(
            "--prompts %s: skipped %d comment line(s) starting with # (write \\# to start a prompt with #)",
            path,
            comments,
        )
    return rows


def _parquet_rows(path: Path) -> list[PromptRow]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(
            f"--prompts {path}: reading Parquet needs pyarrow, which is not installed; install it "
            '(pip install pyarrow) or give the prompts as JSON Lines (one {"prompt": ...} a line)'
        ) from None
    records = pq.read_table(path).to_pylist()
    return [record_row(r, n, path, "row") for n, r in enumerate(records, start=1)]


def _dataset_rows(path: Path) -> list[PromptRow]:
    if not (path / "dataset_info.json").is_file() and not (path / "dataset_dict.json").is_file():
        raise ValueError(
            f"--prompts {path} is a folder but not one saved by Hugging Face datasets' save_to_disk "
            "(no dataset_info.json); give a .txt, .jsonl or .parquet file"
        )
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"--prompts {path}: reading a Hugging Face datasets folder needs the datasets package, "
            "which is not installed; install it (pip install datasets) or export the prompts as JSON "
            "Lines"
        ) from None
    data = datasets.load_from_disk(str(path))
    if isinstance(data, datasets.DatasetDict):
        if "train" not in data:
            raise ValueError(f"--prompts {path}: a DatasetDict without a 'train' split (it has {list(data)})")
        data = data["train"]
    return [record_row(r, n, path, "row") for n, r in enumerate(data, start=1)]


def check_rows(rows: list[PromptRow], path: Path) -> dict[str, str]:
    """ValueError for no prompts, an empty or too long one, or one prompt given twice with different fields;
    returns prompt -> fields JSON for the prompts that carry fields."""
    if not rows:
        raise ValueError(
            f"--prompts {path}: holds no prompt (text: one a line, # starts a comment; JSON Lines: "
            f'one {{"{PROMPT_COLUMN}": ...}} a line; JSON: an array of them; CSV: a "{PROMPT_COLUMN}" column)'
        )
    if len(rows) > MAX_PROMPTS:
        raise ValueError(f"--prompts {path}: {len(rows)} prompts, more than {MAX_PROMPTS}")
    fields: dict[str, tuple[str, int]] = {}
    for row in rows:
        if not row.text:
            raise ValueError(f"--prompts {path}: line {row.line}: the prompt is empty")
        if len(row.text) > MAX_PROMPT_CHARS:
            raise ValueError(
                f"--prompts {path}: line {row.line}: the prompt has {len(row.text)} characters, more "
                f"than {MAX_PROMPT_CHARS}"
            )
        known = fields.setdefault(row.text, (row.fields_json, row.line))
        if known[0] != row.fields_json:
            raise ValueError(
                f"--prompts {path}: line {row.line} repeats the prompt of line {known[1]} with other "
                "fields; a prompt's fields must be the same wherever it appears"
            )
    return {text: f for text, (f, _) in fields.items() if f != "{}"}


def _bucket(text: str) -> float:
    digest = hashlib.blake2b(text.encode(), digest_size=8, person=b"heldout").digest()
    return int.from_bytes(digest, "big") / 2**64


def split_heldout(texts: tuple[str, ...], fraction: float, path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(training prompts in file order, distinct held-out prompts); a prompt is held out when its text's hash falls
    below `fraction`, so both sides are fixed by the file alone."""
    if fraction == 0:
        return texts, ()
    heldout = tuple(dict.fromkeys(t for t in texts if _bucket(t) < fraction))
    train = tuple(t for t in texts if _bucket(t) >= fraction)
    if not train or not heldout:
        raise ValueError(
            f"--prompts {path}: holding out {fraction:.0%} of {len(set(texts))} distinct prompts leaves "
            f"{len(train)} to train on and {len(heldout)} held out; both need at least one"
        )
    return train, heldout


def draw_prompts(source: PromptSource, seed: int, iteration: int, num_prompts: int) -> list[str]:
    """Iteration `iteration`'s training prompts: positions iteration*num_prompts ... of an endless walk over the
    training prompts in epochs, each epoch a permutation drawn from (seed, epoch) in the "prompts" seed domain."""
    train = source.table().train
    out = []
    for position in range(iteration * num_prompts, (iteration + 1) * num_prompts):
        epoch, index = divmod(position, len(train))
        out.append(train[_epoch_order(seed, epoch, len(train))[index]])
    return out


@functools.lru_cache(maxsize=8)
def _epoch_order(seed: int, epoch: int, size: int) -> tuple[int, ...]:
    rng = np.random.default_rng(domain_seed(seed, "prompts", epoch))
    return tuple(int(i) for i in rng.permutation(size))


def train_prompts(config, iteration: int) -> list[str]:
    """A TrainConfig's training prompts of `iteration`: drawn from its prompts file when it names one, else
    MiniGenEval's category-balanced draw (`workers.task.prompts.iteration_prompts`)."""
    if config.prompts is not None:
        return draw_prompts(config.prompts, config.seed, iteration, config.prompts_per_iteration)

    return iteration_prompts(config.seed, iteration, config.prompts_per_iteration, config.train_categories)


def prompt_fields(source: PromptSource | None, prompt: str) -> dict[str, Any]:
    """The fields the prompts file gave `prompt` besides its text ({} for none, or without a file)."""
    if source is None:
        return {}
    return json.loads(source.table().fields.get(prompt, "{}"))


def negative_prompts(source: PromptSource | None) -> dict[str, str]:
    """Prompt -> its row's own negative prompt, for the rows that give one ({} without a file)."""
    if source is None:
        return {}
    out = {}
    for prompt, fields in source.table().fields.items():
        negative = json.loads(fields).get(NEGATIVE_PROMPT_FIELD)
        if negative is not None:
            out[prompt] = negative
    return out
