"""The report a person reads: captioned held-out grids, base vs latest weights, curves per category,
exploration payoff."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from workers.coordinator.report import write_report
from workers.coordinator.sample_grids import heldout_pictures, shown_indices
from workers.task.evaluate import evaluate
from workers.task.prompts import parse_prompt, split_prompts


def _not_blank(png_path) -> bool:
    return float(np.asarray(Image.open(png_path).convert("L")).std()) > 5


@pytest.fixture
def heldout(tiny_policy):
    result = evaluate(tiny_policy, split_prompts()["heldout"], seeds_per_prompt=1, keep_images=True)
    return result.images, result.prompts


def test_held_out_grids_are_captioned_with_the_prompt_and_a_verdict_per_criterion(heldout, tmp_path) -> None:
    images, prompts = heldout
    first = heldout_pictures(tmp_path, 0, images, prompts)
    assert set(first) == {"heldout_samples"}  # nothing to compare v0 with
    later = heldout_pictures(tmp_path, 3, images[::-1].copy(), prompts)  # other pictures, same prompts and seeds
    assert set(later) == {"heldout_samples", "before_after"}
    shown = [prompts[i] for i in shown_indices(prompts)]
    assert {parse_prompt(p).category for p in shown} == {parse_prompt(p).category for p in prompts}
    captions = json.loads((tmp_path / "heldout_samples.json").read_text())["captions"]
    assert [c.splitlines()[0] for c in captions] == shown
    for caption, prompt in zip(captions, shown, strict=False):
        groups = len(parse_prompt(prompt).groups)
        assert caption.count("count ") == groups and caption.count("✓") + caption.count("✗") >= 3 * groups
    pair = json.loads((tmp_path / "before_after.json").read_text())["captions"]
    assert (
        len(pair) == 2 * len(shown) and pair[0].startswith(f"{shown[0]}\nv0: ") and pair[len(shown)].startswith("v3: ")
    )
    for name in ("heldout_samples.png", "before_after.png", "grids/it-000003-heldout.png"):
        assert _not_blank(tmp_path / name), name
    assert later["before_after"][0] == (tmp_path / "before_after.png").read_bytes()


def test_the_report_page_shows_the_grids_per_category_curves_and_exploration_payoff(
    heldout, mem_ledger, tmp_path
) -> None:
    images, prompts = heldout
    empty = write_report(mem_ledger, None, "demo", tmp_path / "empty")
    report = tmp_path / "report"
    for k in (0, 2):
        heldout_pictures(report, k, images, prompts)
        mem_ledger.record_validation(
            k,
            weights_version=k,
            score=0.1 * k,
            num_prompts=64,
            criteria={"category.counting": 0.2 + k / 10, "category.position": 0.1},
        )
    mem_ledger.record_seed_groups(
        [
            {
                "iteration": k,
                "prompt_index": 0,
                "prompt": "p",
                "planner": planner,
                "source": source,
                "seeds": "1,2",
                "num_drawn": 2,
                "num_trained": 2,
                "trained_variance": v,
                "drawn_variance": v,
                "baseline_variance": 0.04,
            }
            for k, planner, source, v in (
                (0, "default", "random", 0.04),
                (1, "explore:m8-half_steps", "explored", 0.09),
            )
        ]
    )
    written = write_report(mem_ledger, None, "demo", report)
    page = written.index.read_text()
    assert "Held-out samples, pass/fail per criterion" in page and "Before / after" in page
    for name in ("heldout_samples.png", "before_after.png", "payoff.png", "categories.png"):
        assert f'src="{name}"' in page and _not_blank(report / name), name
    for i in shown_indices(prompts):
        assert prompts[i] in page
    assert written.plots["categories"] != empty.plots["categories"] and written.plots["payoff"] != empty.plots["payoff"]
    assert "Held-out samples" not in empty.index.read_text()  # no validation drew pictures: no empty section


def test_ocr_scored_grids_print_what_ocr_read_under_each_sample(tmp_path) -> None:
    from workers.task.miniocr import parse_ocr_prompt, render_text

    prompts = ['"K7" in red', '"4HX" in bold yellow']
    rng = np.random.default_rng(0)
    images = np.stack([render_text(parse_ocr_prompt(p), rng) for p in prompts] + [np.zeros((32, 32, 3), np.uint8)])
    heldout_pictures(tmp_path, 0, images, [*prompts, '"P9" in white'], scores=[1.0, 1.0, 0.0], reward="ocr")
    captions = json.loads((tmp_path / "heldout_samples.json").read_text())["captions"]
    assert [c.splitlines()[-1] for c in captions] == ['read: "K7"', 'read: "4HX"', 'read: ""']


def test_an_ocr_reading_the_plot_font_cannot_draw_is_written_as_escapes() -> None:
    from workers.coordinator.sample_grids import reading_line

    assert reading_line("K7") == 'read: "K7"' and reading_line(None) == "read: (OCR failed)"
    assert reading_line("K\u65e5") == 'read: "K\\u65e5"'  # PP-OCR read a CJK character: no empty box drawn
