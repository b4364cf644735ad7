"""Whether a run's reward can score its prompts, checked before any weights load.

Some rewards read what to score from the prompt itself: MiniGenEval parses its grammar ("two red circles"), OCR
reads the quoted text to render (or a `text` field). Such a reward on prompts it cannot read would fail at the first
scoring, after the model loaded and sampled; `check_reward_reads_prompts` refuses the run at once, naming the reward,
the prompts file, the first prompt it cannot read, and what to do. Rewards that score any prompt (CLIP/PickScore, a
reward server, JPEG compressibility) pass; a multi-reward is checked component by component.

Example:
    check_reward_reads_prompts("minigeneval", PromptSource.from_file("/data/prompts.txt"))   # ValueError
"""

from __future__ import annotations

import json
from typing import Callable, Iterator, Optional

from workers.task.prompt_file import PromptSource
from workers.task.prompts import parse_prompt, split_prompts
from workers.task.rewards_multi import parse_multi_spec
from workers.task.rewards_ocr import target_text

FREE_TEXT_REWARDS = "clip:/models/PickScore_v1 (PickScore), http://HOST:8200 (a spotlight reward-serve server)"
"""Rewards that score any prompt, named in the refusals."""


def _minigeneval(prompt: str, fields: dict) -> None:
    parse_prompt(prompt)


def _ocr(prompt: str, fields: dict) -> None:
    target_text(prompt, fields or None)


PROMPT_READERS: dict[str, tuple[Callable[[str, dict], None], str]] = {
    "minigeneval": (_minigeneval, "it scores MiniGenEval's grammar only (e.g. 'two red circles on the left')"),
    "minigeneval_strict": (_minigeneval, "it scores MiniGenEval's grammar only (e.g. 'two red circles')"),
    "ocr": (_ocr, 'it scores the quoted text a prompt asks to render (a sign that says "OPEN") or its `text` field'),
}
"""Reward name (or kind, for `ocr:ARG`) -> (a check that raises ValueError on a prompt it cannot score, what it
reads)."""


def reward_parts(spec: str) -> Iterator[str]:
    """The reward names a spec scores with: itself, its kind (`ocr:threads=4` -> ocr), or a multi-reward's parts."""
    kind, sep, arg = spec.partition(":")
    if kind == "multi" and sep:
        for _, part, _ in parse_multi_spec(arg).components:
            yield from reward_parts(part)
    else:
        yield kind if sep and kind in PROMPT_READERS else spec


def check_reward_reads_prompts(spec: str, source: Optional[PromptSource]) -> None:
    """ValueError naming the reward, the prompts file, the first prompt it cannot score and what to do, when a
    component of `spec` reads its target from the prompt and cannot from these (`source` None: MiniGenEval's
    grammar, the run's prompts without --prompts)."""
    for part in dict.fromkeys(reward_parts(spec)):
        if part not in PROMPT_READERS:
            continue
        read, reads = PROMPT_READERS[part]
        for line, prompt, fields in _rows(source):
            try:
                read(prompt, fields)
            except ValueError as err:
                where = f"--prompts {source.path}, line {line}" if source else "MiniGenEval's prompts (no --prompts)"
                raise ValueError(
                    f"reward {spec!r} cannot score the run's prompts: {where}: {err}; {reads}. "
                    f"Pass a reward that scores free text (--reward {FREE_TEXT_REWARDS}), or prompts it can read"
                ) from None


def _rows(source: Optional[PromptSource]) -> Iterator[tuple[int, str, dict]]:
    """(line, prompt, fields) of every prompt the run draws from."""
    if source is None:
        for n, prompt in enumerate(split_prompts()["train"], start=1):
            yield n, prompt, {}
        return
    table = source.table()
    for row in table.rows:
        yield row.line, row.text, json.loads(row.fields_json)
