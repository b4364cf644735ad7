"""`spotlight bench pulse-modes` at a quick setting: a tiny Qwen-Image LoRA trained by the trainer's own update,
synced as adapter patches, merged-weight patches and dense, each receiver reaching the trainer's hash."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from workers.bench.pulse_modes import run_pulse_modes
from workers.model.families.diffusers_policy import load_model_policy
from workers.model.families.lora import merged_weights
from workers.model.families.tiny import build_tiny_pipeline


@pytest.fixture(scope="module")
def qwen_path(tmp_path_factory):
    return build_tiny_pipeline("qwen-image", tmp_path_factory.mktemp("qwen") / "qwen")


def test_every_mode_reaches_the_trainers_hash_and_merged_patches_touch_only_lora_targets(qwen_path):
    figures = run_pulse_modes(str(qwen_path), lora_rank=2, steps=2, resolution=32)
    assert [r["step"] for r in figures["per_step"]] == [1, 2]
    for row in figures["per_step"]:
        assert all(row[mode]["reached_trainer_hash"] for mode in ("lora", "merged", "dense"))
        assert row["merged"]["changed_outside_targets"] == 0.0  # a LoRA can only move the weights it sits on
        assert 0 < row["merged"]["changed_fraction"] < row["merged"]["changed_fraction_of_targets"] <= 1
        assert row["dense"]["bytes"] >= 2 * figures["num_values"]["merged"]  # every BF16 value, every step
        assert row["merged"]["bytes"] < row["dense"]["bytes"]
    assert figures["total"]["lora"]["bytes"] == sum(r["lora"]["bytes"] for r in figures["per_step"])


def test_the_merged_weights_are_what_diffusers_fuse_lora_gives(qwen_path):
    policy = load_model_policy(qwen_path, resolution=32, lora_rank=2)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.1 * torch.randn_like(p))
    ours, targets = merged_weights(policy.transformer)
    policy.transformer.fuse_lora(lora_scale=1.0)
    fused = {k.replace(".base_layer.", "."): v for k, v in policy.transformer.state_dict().items() if ".lora_" not in k}
    assert targets and set(ours) == set(fused)
    assert all(torch.equal(ours[n], fused[n].to(torch.bfloat16)) for n in ours)  # bit for bit, targets included


def test_the_command_prints_one_json_object(qwen_path):
    from pipelines.cli import app

    out = CliRunner().invoke(
        app,
        [
            "bench",
            "pulse-modes",
            "--model",
            str(qwen_path),
            "--lora-rank",
            "2",
            "--steps",
            "1",
            "--resolution",
            "32",
            "--json",
        ],
    )
    assert out.exit_code == 0, out.output
    figures = json.loads(out.output.strip().splitlines()[-1])
    assert set(figures["total"]) == {"lora", "merged", "dense"} and figures["steps"] == 1
    bad = CliRunner().invoke(app, ["bench", "pulse-modes", "--model", str(qwen_path), "--resolution", "36"])
    assert bad.exit_code != 0 and "multiple of 8" in bad.output
