"""MiniOCR's prompts: their grammar, the shipped file and its held-out strings, and how the tiny policy reads them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workers.task.miniocr import (
    MAX_TOKENS,
    MINIOCR_PROMPTS,
    OcrPromptError,
    OcrSpec,
    ocr_prompt_text,
    parse_ocr_prompt,
    prompt_rows,
    render_text,
    tokenize_ocr,
)
from workers.trainer.presets import get_preset


def test_prompts_round_trip_through_the_grammar():
    for spec in (OcrSpec("K7", "regular", "red"), OcrSpec("4HXP", "bold", "white")):
        assert parse_ocr_prompt(ocr_prompt_text(spec)) == spec
    assert ocr_prompt_text(OcrSpec("4HXP", "bold", "white")) == '"4HXP" in bold white'


@pytest.mark.parametrize("prompt", ['"K7" in purple', '"K" in red', '"KO7" in red', "K7 in red", '"K7" on red'])
def test_prompts_outside_the_grammar_say_what_is_wrong(prompt):
    with pytest.raises(OcrPromptError):
        parse_ocr_prompt(prompt)


def test_the_shipped_prompts_file_is_what_the_generator_writes():
    lines = MINIOCR_PROMPTS.read_text().splitlines()
    assert [json.loads(line) for line in lines] == prompt_rows()


def test_held_out_strings_are_never_training_strings():
    source = get_preset("cpu_tiny_ocr").prompts
    table = source.table()
    train = {parse_ocr_prompt(p).text for p in table.train}
    heldout = {parse_ocr_prompt(p).text for p in table.heldout}
    assert len(heldout) >= 40 and not train & heldout


def test_every_prompt_fits_the_text_encoder():
    ids, lengths = tokenize_ocr(['"4HXP" in bold white', '"K7" in red'])
    assert lengths == [7, 4] and all(len(row) == MAX_TOKENS for row in ids)


def test_rendered_text_stays_on_the_canvas():
    rng = np.random.default_rng(0)
    for text in ("HNHN", "4H4H", "K7"):
        image = render_text(OcrSpec(text, "bold", "white"), rng)
        lit_columns = np.flatnonzero(image.max(axis=(0, 2)) > 0)
        assert image.shape == (32, 32, 3) and lit_columns.min() > 0 and lit_columns.max() < 31


def test_the_tiny_policy_reads_miniocr_prompts_and_keeps_its_task(tmp_path):
    from workers.model.tiny_policy import PolicyConfig, build_policy, load_policy, save_policy

    policy = build_policy(PolicyConfig(task="miniocr", num_layers=1))
    emb, mask = policy.encode_prompts(['"4HXP" in bold white'])
    assert emb.shape == (1, MAX_TOKENS, 64) and int(mask.sum()) == 7
    save_policy(policy, tmp_path)
    assert load_policy(tmp_path).config.task == "miniocr"
    with pytest.raises(ValueError):
        policy.encode_prompts(["a red circle"])


def test_a_rollout_worker_serves_miniocr_prompts_only_to_a_miniocr_policy():
    from workers.model.tiny_policy import PolicyConfig, build_policy
    from workers.task.request_fields import check_policy_reads

    text, scenes = build_policy(PolicyConfig(task="miniocr", num_layers=1)), build_policy(PolicyConfig(num_layers=1))
    check_policy_reads(text, '"K7" in red')
    check_policy_reads(scenes, "a red circle")
    with pytest.raises(ValueError):
        check_policy_reads(text, "a red circle")
    with pytest.raises(ValueError):
        check_policy_reads(scenes, '"K7" in red')
