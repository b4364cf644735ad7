"""Prompts files in every format a user brings: a JSON array and CSV are read as records (never as lines of text),
formats that are not prompts are refused, a row's negative prompt comes along, and a plain-text file's comment
lines are counted aloud, with `\\#` for a prompt that starts with #."""

from __future__ import annotations

import json
import logging

import pytest

from workers.task.prompt_file import PromptSource, negative_prompts, prompt_fields


def test_a_json_array_of_records_or_strings_is_read_as_prompts(tmp_path):
    records = [{"prompt": "a sign that says OPEN", "reference": "OPEN"}, {"prompt": "two cats"}]
    (tmp_path / "p.json").write_text(json.dumps(records, indent=2))  # one record over several lines
    source = PromptSource.from_file(tmp_path / "p.json")
    assert source.table().train == ("a sign that says OPEN", "two cats")
    assert prompt_fields(source, "a sign that says OPEN") == {"reference": "OPEN"}
    (tmp_path / "s.json").write_text(json.dumps(["a red fox", "#1 best photo"]))
    assert PromptSource.from_file(tmp_path / "s.json").table().train == ("a red fox", "#1 best photo")


def test_a_csv_or_tsv_file_is_read_by_its_prompt_column_with_the_rest_as_fields(tmp_path):
    (tmp_path / "p.csv").write_text(
        'prompt,negative_prompt,reference\n"a sign, red, that says OPEN",blurry,OPEN\n'
        '"#hashtag, a cat",,\n"a line\nbroken in two",,x\n'
    )
    source = PromptSource.from_file(tmp_path / "p.csv")
    assert source.table().train == ("a sign, red, that says OPEN", "#hashtag, a cat", "a line\nbroken in two")
    assert prompt_fields(source, "a sign, red, that says OPEN") == {"negative_prompt": "blurry", "reference": "OPEN"}
    assert prompt_fields(source, "#hashtag, a cat") == {}  # empty cells are no field
    assert negative_prompts(source) == {"a sign, red, that says OPEN": "blurry"}
    (tmp_path / "p.tsv").write_text("prompt\tnegative_prompt\na cat\tugly\n")
    assert negative_prompts(PromptSource.from_file(tmp_path / "p.tsv")) == {"a cat": "ugly"}


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("p.json", '{"prompt": "one object"}', "holds an array"),
        ("p.json", '[{"prompt": "ok"}, {"text": "no prompt"}]', "item 2 has no 'prompt' field"),
        ("p.json", '[{"prompt": "ok"},', "not JSON"),
        ("p.csv", "text,reference\na cat,x\n", "names no 'prompt' column"),
        ("p.csv", "prompt,reference\na cat,x\nsome dog,y,extra\n", "line 3 has not the header's 2 columns"),
        ("p.jsonl", '{"prompt": "a cat", "negative_prompt": 3}\n', "'negative_prompt' is int, not text"),
        ("p.yaml", "- prompt: a cat\n", "a .yaml file is not a prompts format"),
    ],
)
def test_a_structured_file_that_is_not_prompts_is_refused_not_read_as_lines(tmp_path, name, content, message):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=message):
        PromptSource.from_file(tmp_path / name)


def test_a_text_files_comment_lines_are_counted_aloud_and_an_escaped_hash_is_a_prompt(tmp_path, caplog):
    (tmp_path / "p.txt").write_text("# my prompts\na red fox\n\\#1 trending photo\n  # indented comment\n")
    with caplog.at_level(logging.WARNING, logger="workers.task.prompt_file"):
        source = PromptSource.from_file(tmp_path / "p.txt")
    assert source.table().train == ("a red fox", "#1 trending photo")
    assert "skipped 2 comment line(s)" in caplog.text
    caplog.clear()
    (tmp_path / "q.txt").write_text("a red fox\n")
    with caplog.at_level(logging.WARNING, logger="workers.task.prompt_file"):
        PromptSource.from_file(tmp_path / "q.txt")
    assert "comment" not in caplog.text
