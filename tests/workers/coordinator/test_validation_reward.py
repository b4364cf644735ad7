"""A run on a diffusers pipeline validates with a reward (here a tiny CLIP, as PickScore would) on the held-out
prompts a user gave, with fixed seeds; the ledger, the record and the report say which reward scored it. Bad
validation options stop `spotlight train` and `spotlight run` before anything is computed or written."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from resources.settings.resolve import flag_layer, resolve
from tests.workers.task.test_rewards_clip import save_tiny_clip
from workers.coordinator.context import RunContext
from workers.coordinator.phases import report_phase, sync_phase, validate_phase
from workers.model.families.tiny import build_tiny_pipeline
from workers.task.rewards import get_reward
from workers.task.validation import validation_from_options
from workers.trainer.from_config import model_spec_fields
from workers.trainer.presets import PRESETS, get_preset

PROMPTS = ("a red circle on the left", "two blue squares", "the yellow triangle")


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    return build_tiny_pipeline("qwen-image", tmp_path_factory.mktemp("qwen") / "qwen")


@pytest.fixture(scope="module")
def clip_spec(tmp_path_factory) -> str:
    return f"clip:{save_tiny_clip(tmp_path_factory.mktemp('clip') / 'clip')}"


def _model_fields(qwen) -> dict:
    """The ModelSpec fields of a cpu_smoke run on the tiny Qwen-Image folder at 32 px with a rank-4 LoRA."""
    flags = {"preset": "cpu_smoke", "model": str(qwen), "resolution": 32, "lora_rank": 4}
    return model_spec_fields(resolve([flag_layer(flags)], PRESETS).config)


def _prompts_file(tmp_path):
    path = tmp_path / "heldout.txt"
    path.write_text("# held-out prompts\n" + "\n".join(PROMPTS) + "\n")
    return path


def test_a_model_run_validates_with_the_named_reward_on_the_given_prompts_and_says_so(qwen, clip_spec, tmp_path):
    config = dataclasses.replace(get_preset("cpu_smoke"), reward="jpeg_compressibility")
    fields = _model_fields(qwen)
    validation = validation_from_options(clip_spec, _prompts_file(tmp_path), config.reward, model=True)
    ctx = RunContext.local(
        tmp_path / "run", "demo", "cpu_smoke", config, checkpoint=str(qwen), model=fields, validation=validation
    )
    sync_phase(ctx, 0)
    out = validate_phase(ctx, 0)
    report_phase(ctx, 0)

    (row,) = ctx.ledger.query("SELECT reward, score, num_prompts FROM validation").as_dicts()
    assert row["reward"] == clip_spec and row["num_prompts"] == len(PROMPTS)
    assert out.metadata["reward"] == clip_spec and out.record["validation_reward"] == clip_spec
    assert out.record["validation_score"] == pytest.approx(row["score"], abs=1e-6)
    # cpu_smoke validates with one fixed seed, and the report keeps the first seed's images of up to 8 prompts:
    # every held-out image. Scoring them again with the reward gives the held-out score: the mean over them.
    kept = np.load(ctx.report_dir / "samples" / "heldout-v0.npz")
    assert [str(p) for p in kept["prompts"]] == list(PROMPTS)
    assert row["score"] == pytest.approx(float(np.mean(get_reward(clip_spec)(kept["images"], list(PROMPTS)))))
    captions = json.loads((ctx.report_dir / "heldout_samples.json").read_text())["captions"]
    assert all(c.splitlines()[1].startswith("clip:") for c in captions)
    assert clip_spec in (ctx.report_dir / "index.html").read_text()
    again = validate_phase(ctx, 0)  # fixed seeds and the ODE: validating the same weights gives the same score
    assert again.metadata["score"] == out.metadata["score"]


def test_a_model_run_validates_with_its_own_reward_by_default(qwen, tmp_path):
    config = dataclasses.replace(get_preset("cpu_smoke"), reward="jpeg_compressibility")
    fields = _model_fields(qwen)
    validation = validation_from_options(None, _prompts_file(tmp_path), config.reward, model=True)
    ctx = RunContext.local(
        tmp_path / "run",
        "demo",
        "cpu_smoke",
        config,
        checkpoint=str(qwen),
        model=fields,
        validation=validation,
        report=False,
    )
    sync_phase(ctx, 0)
    out = validate_phase(ctx, 0)
    assert out.record["validation_reward"] == "jpeg_compressibility" and out.metadata["score"] < 0  # minus KB
    assert ctx.ledger.query("SELECT reward FROM validation").rows == [("jpeg_compressibility",)]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--validation-prompts", "missing.txt"], "no such file"),
        (["--validation-reward", "pickscroe"], "unknown reward"),
        (["--validation-prompts", "corgi.txt"], "not a MiniGenEval prompt"),
        (["--validation-reward", "multi:minigeneval=1,jpeg_compressibility=1,normalize=zscore"], "average to 0"),
    ],
)
def test_bad_validation_options_stop_train_and_run_before_anything_is_written(tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corgi.txt").write_text("a photo of a corgi\n")
    for command in (
        ["train", "--preset", "cpu_smoke", "--out", str(tmp_path / "out")],
        ["run", "--preset", "cpu_smoke", "--run-dir", str(tmp_path / "run")],
    ):
        done = CliRunner().invoke(app, [*command, *args], env={"COLUMNS": "400"})
        assert done.exit_code != 0 and message in " ".join(done.output.split()), done.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_spotlight_train_on_a_model_reports_the_held_out_reward_each_validation(qwen, clip_spec, tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "train",
            "--model",
            str(qwen),
            "--preset",
            "cpu_smoke",
            "--iterations",
            "1",
            "--resolution",
            "32",
            "--lora-rank",
            "4",
            "--reward",
            "jpeg_compressibility",
            "--validation-reward",
            clip_spec,
            "--validation-prompts",
            str(_prompts_file(tmp_path)),
            "--out",
            str(tmp_path / "run"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["iteration"], r["validation_reward"], r["validation_num_prompts"]) for r in records] == [
        (0, clip_spec, 3),
        (1, clip_spec, 3),
    ]
    assert all(r["validation_partial"] is None and isinstance(r["validation_score"], float) for r in records)
