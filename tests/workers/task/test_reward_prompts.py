"""A reward that reads its target from the prompt is refused, before any weights load, on prompts it cannot read."""

from __future__ import annotations

import pytest

from workers.task.prompt_file import PromptSource
from workers.task.reward_prompts import check_reward_reads_prompts


def _prompts(tmp_path, name: str, text: str) -> PromptSource:
    path = tmp_path / name
    path.write_text(text)
    return PromptSource.from_file(path)


@pytest.mark.parametrize(
    "reward", ["minigeneval", "minigeneval_strict", "multi:jpeg_compressibility=0.1,minigeneval=1"]
)
def test_minigeneval_on_free_text_is_refused_naming_the_reward_the_file_the_line_and_what_to_do(tmp_path, reward):
    source = _prompts(tmp_path, "prompts.txt", "two red circles\na cat sleeping on a sofa\n")
    with pytest.raises(ValueError) as err:
        check_reward_reads_prompts(reward, source)
    message = str(err.value)
    assert f"reward {reward!r} cannot score" in message and f"{source.path}, line 2" in message
    assert "a cat sleeping on a sofa" in message and "--reward clip:" in message


def test_ocr_needs_a_quoted_target_or_a_text_field(tmp_path):
    quoted = _prompts(tmp_path, "quoted.txt", 'a sign that says "OPEN"\n')
    fields = _prompts(tmp_path, "fields.jsonl", '{"prompt": "a shop sign", "text": "OPEN"}\n')
    for source in (quoted, fields):
        check_reward_reads_prompts("ocr:threads=2", source)
    bare = _prompts(tmp_path, "bare.txt", 'a sign that says "OPEN"\na shop sign\n')
    with pytest.raises(ValueError, match=r"reward 'ocr' cannot score .*bare.txt, line 2.*quote the text"):
        check_reward_reads_prompts("ocr", bare)


def test_ocr_on_minigeneval_prompts_is_refused_and_a_reward_for_any_text_passes(tmp_path):
    with pytest.raises(ValueError, match=r"MiniGenEval's prompts \(no --prompts\)"):
        check_reward_reads_prompts("ocr", None)
    check_reward_reads_prompts("minigeneval", None)
    check_reward_reads_prompts("jpeg_compressibility", _prompts(tmp_path, "p.txt", "a cat on a sofa\n"))
