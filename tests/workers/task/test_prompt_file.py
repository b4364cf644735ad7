"""`--prompts FILE`: the user's training prompts, read and checked before any compute, drawn by the run seed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workers.task.prompt_file import PromptSource, draw_prompts, prompt_fields, train_prompts

PROMPTS = [f"a photo of object number {i}" for i in range(10)]


def _jsonl(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_a_text_file_gives_one_prompt_a_line_without_blanks_or_comments(tmp_path):
    (tmp_path / "p.txt").write_text("# my prompts\n\n  a red fox in snow  \n# another comment\na city at night\n")
    source = PromptSource.from_file(tmp_path / "p.txt")
    assert source.table().train == ("a red fox in snow", "a city at night")
    assert prompt_fields(source, "a city at night") == {}


def test_json_lines_hand_each_prompts_other_fields_to_the_reward(tmp_path):
    path = _jsonl(
        tmp_path / "p.jsonl",
        [
            {"prompt": "a sign that says OPEN", "reference": "OPEN"},
            {"prompt": "two cats", "tags": ["counting"], "count": 2},
        ],
    )
    source = PromptSource.from_file(path)
    assert prompt_fields(source, "a sign that says OPEN") == {"reference": "OPEN"}
    assert prompt_fields(source, "two cats") == {"tags": ["counting"], "count": 2}


@pytest.mark.parametrize(
    "content,message",
    [
        ("", "holds no prompt"),
        ("\n\n", "holds no prompt"),
        ('# a comment\n{"prompt": "ok"}\n', "line 1 is not JSON"),  # comments are a plain-text file's only
        ('{"prompt": "ok"}\n{"text": "no prompt column"}\n', "line 2 has no 'prompt' field"),
        ('{"prompt": "ok"}\n\n{"prompt": "ok", \n', "line 3 is not JSON"),
        ('{"prompt": "ok"}\n{"prompt": 7}\n', "line 2: 'prompt' is int"),
        ('{"prompt": "ok"}\n{"prompt": "  "}\n', "line 2: the prompt is empty"),
        (
            '{"prompt": "ok", "a": 1}\n{"prompt": "ok", "a": 2}\n',
            "line 2 repeats the prompt of line 1 with other fields",
        ),
        ('["a list"]\n', "line 1 is not a JSON object"),
        ('{"prompt": "%s"}\n' % ("x" * 10_001), "line 1: the prompt has 10001 characters"),
    ],
)
def test_a_bad_prompts_file_is_refused_with_its_line_number(tmp_path, content, message):
    (tmp_path / "p.jsonl").write_text(content)
    with pytest.raises(ValueError, match=message):
        PromptSource.from_file(tmp_path / "p.jsonl")


def test_parquet_and_datasets_folders_say_what_to_install_when_their_reader_is_missing(tmp_path):
    (tmp_path / "p.parquet").write_bytes(b"PAR1")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="needs pyarrow"):
            PromptSource.from_file(tmp_path / "p.parquet")
    folder = tmp_path / "ds"
    folder.mkdir()
    with pytest.raises(ValueError, match="not one saved by Hugging Face datasets"):
        PromptSource.from_file(folder)
    (folder / "dataset_info.json").write_text("{}")
    try:
        import datasets  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="needs the datasets package"):
            PromptSource.from_file(folder)
    with pytest.raises(ValueError, match="no such file"):
        PromptSource.from_file(tmp_path / "missing.txt")


def test_draws_are_fixed_by_the_run_seed_and_each_epoch_draws_every_prompt_once(tmp_path):
    (tmp_path / "p.txt").write_text("\n".join(PROMPTS))
    source = PromptSource.from_file(tmp_path / "p.txt")
    epoch = [p for it in range(5) for p in draw_prompts(source, seed=0, iteration=it, num_prompts=2)]
    assert sorted(epoch) == sorted(PROMPTS)  # 5 iterations x 2 = one pass over the 10 prompts
    assert draw_prompts(source, 0, 3, 4) == draw_prompts(PromptSource.from_file(tmp_path / "p.txt"), 0, 3, 4)
    assert draw_prompts(source, 1, 0, 10) != draw_prompts(source, 0, 0, 10)  # another seed, another order


def test_a_held_out_share_is_split_by_prompt_text_and_never_trained_on(tmp_path):
    many = [f"prompt {i}" for i in range(400)]
    (tmp_path / "p.txt").write_text("\n".join(many))
    (tmp_path / "reversed.txt").write_text("\n".join(reversed(many)))
    source = PromptSource.from_file(tmp_path / "p.txt", heldout_fraction=0.25)
    table = source.table()
    assert not set(table.train) & set(table.heldout) and len(table.train) + len(table.heldout) == 400
    assert 60 < len(table.heldout) < 140
    assert set(PromptSource.from_file(tmp_path / "reversed.txt", 0.25).table().heldout) == set(table.heldout)
    drawn = {p for it in range(50) for p in draw_prompts(source, 0, it, 8)}
    assert drawn == set(table.train)


def test_a_run_whose_prompts_file_changed_under_it_is_refused(tmp_path):
    (tmp_path / "p.txt").write_text("\n".join(PROMPTS))
    source = PromptSource.from_file(tmp_path / "p.txt")
    (tmp_path / "p.txt").write_text("\n".join(PROMPTS[:3]))
    changed = PromptSource(source.path, source.digest, heldout_fraction=0.0)
    from workers.task.prompt_file import load_table

    load_table.cache_clear()
    with pytest.raises(ValueError, match="changed since the run started"):
        changed.table()


def test_a_train_config_draws_from_its_prompts_file_and_rewards_get_the_fields(tmp_path):
    import dataclasses

    from workers.task.rewards import score_with_components
    from workers.trainer.presets import get_preset

    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": p, "index": i} for i, p in enumerate(PROMPTS)])
    config = dataclasses.replace(get_preset("cpu_smoke"), prompts=PromptSource.from_file(path))
    prompts = train_prompts(config, 0)
    assert len(prompts) == config.prompts_per_iteration and set(prompts) <= set(PROMPTS)

    seen = []

    def reward_with_fields(images, prompts, fields=None):
        seen.append(fields)
        return np.array([f["index"] for f in fields], dtype=np.float64)

    fields = [prompt_fields(config.prompts, p) for p in prompts]
    totals, _ = score_with_components(reward_with_fields, np.zeros((len(prompts), 8, 8, 3), np.uint8), prompts, fields)
    assert totals.tolist() == [PROMPTS.index(p) for p in prompts]
    # a reward without a `fields` keyword is called as it always was
    plain, _ = score_with_components(
        lambda images, prompts: np.ones(len(prompts)), np.zeros((2, 8, 8, 3), np.uint8), prompts[:2], fields[:2]
    )
    assert plain.tolist() == [1.0, 1.0]
