"""`--model DIR` without `--preset`: the folder's family picks its GPU recipe, read from the folder before any weights
load, and `spotlight config --explain` says so; a tiny test pipeline keeps the command's CPU preset."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.config_cli import resolve_settings
from resources.settings.resolve import ConfigError

FAMILIES = {
    # family: (pipeline class, its transformer class, the preset of its published recipe)
    "sd3": ("StableDiffusion3Pipeline", "SD3Transformer2DModel", "sd35m_lora"),
    "qwen-image": ("QwenImagePipeline", "QwenImageTransformer2DModel", "qwen_image_lora"),
    "flux": ("FluxPipeline", "FluxTransformer2DModel", "flux1_lora"),
}


def released_width_folder(root: Path, family: str) -> Path:
    """A pipeline folder whose transformer has the released model's width (diffusers' own defaults, built on the
    meta device and written by its own save_config): what spotlight reads of a downloaded model before its weights."""
    import diffusers

    pipeline, transformer, _ = FAMILIES[family]
    folder = root / family
    with torch.device("meta"):
        model = getattr(diffusers, transformer)(num_layers=1)
    model.save_config(folder / "transformer")
    (folder / "model_index.json").write_text(
        json.dumps({"_class_name": pipeline, "transformer": ["diffusers", transformer]})
    )
    return folder


@pytest.mark.parametrize("family", FAMILIES)
def test_a_released_models_family_chooses_its_recipe(tmp_path, family) -> None:
    folder = released_width_folder(tmp_path, family)
    resolved = resolve_settings({"model": str(folder), "run_dir": str(tmp_path / "run")}, [])
    assert resolved.config.preset == FAMILIES[family][2]
    assert f"a {family} pipeline, on its family's preset" in resolved.origin("preset")


def test_spotlight_config_explain_says_the_preset_came_from_the_family(tmp_path) -> None:
    folder = released_width_folder(tmp_path, "sd3")
    result = CliRunner().invoke(app, ["config", "--model", str(folder), "--explain"])
    assert result.exit_code == 0, result.output
    line = next(row for row in result.output.splitlines() if row.startswith("preset "))
    assert "'sd35m_lora'" in line and "--model: a sd3 pipeline, on its family's preset" in line


def test_a_preset_given_wins_over_the_family(tmp_path) -> None:
    folder = released_width_folder(tmp_path, "flux")
    resolved = resolve_settings({"model": str(folder), "preset": "sd35m_lora"}, [])
    assert (resolved.config.preset, resolved.origin("preset")) == ("sd35m_lora", "--preset")


def test_a_tiny_test_pipeline_keeps_the_commands_cpu_preset(tmp_path) -> None:
    from workers.model.families.tiny import build_tiny_pipeline

    folder = build_tiny_pipeline("sd3", tmp_path / "tiny-sd3")
    resolved = resolve_settings({"model": str(folder)}, [], default_preset="cpu_tiny_long")
    assert resolved.config.preset == "cpu_tiny_long" and "a tiny sd3 pipeline" in resolved.origin("preset")


def test_a_folder_that_is_no_pipeline_is_refused_naming_it(tmp_path) -> None:
    (tmp_path / "weights").mkdir()
    with pytest.raises(ConfigError, match="holds no model_index.json.*its family chooses the preset, or pass --preset"):
        resolve_settings({"model": str(tmp_path / "weights")}, [])


def test_a_reward_that_cannot_score_the_prompts_stops_spotlight_run_before_anything_is_written(tmp_path) -> None:
    from workers.model.families.tiny import build_tiny_pipeline

    folder = build_tiny_pipeline("sd3", tmp_path / "tiny-sd3")
    (tmp_path / "free.txt").write_text("a cat sleeping on a sofa\n")
    run_dir = tmp_path / "run"
    flags = ["--model", str(folder), "--preset", "cpu_smoke", "--prompts", str(tmp_path / "free.txt")]
    result = CliRunner().invoke(app, ["run", *flags, "--run-dir", str(run_dir)], env={"COLUMNS": "400"})  # unwrapped
    out = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code == 2, result.output
    assert "reward 'minigeneval' cannot score the run's prompts" in out and "free.txt, line 1" in out
    assert "--reward clip:" in out and not run_dir.exists()
