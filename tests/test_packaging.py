"""What `pip install` builds: the wheel ships the base checkpoints and MiniOCR's prompts as package data, without a
warning wall."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKPOINTS = ("workers/model/checkpoints/base", "workers/model/checkpoints/base_ocr")
"""MiniGenEval's base and MiniOCR's."""


def _source_copy(dest: Path) -> Path:
    """The files a build reads, copied so it writes no build/ or egg-info into the checkout."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    for room in ("workers", "resources", "assets", "pipelines"):
        shutil.copytree(REPO / room, dest / room, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest


def test_wheel_ships_the_base_checkpoint_as_package_data_without_warnings(tmp_path: Path) -> None:
    source = _source_copy(tmp_path / "src")
    # --no-build-isolation: build with the setuptools installed here; an isolated build would fetch it from the
    # registry, and a test must not need the network.
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(source),
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-v",
            "-w",
            str(tmp_path / "dist"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = build.stdout + build.stderr
    assert build.returncode == 0, log[-3000:]
    assert "would be ignored" not in log.lower(), "setuptools warns about the checkpoint folders again"
    (wheel,) = (tmp_path / "dist").glob("spotlight-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for checkpoint in CHECKPOINTS:
        shipped = sorted(p.relative_to(REPO).as_posix() for p in (REPO / checkpoint).rglob("*") if p.is_file())
        for name in ("policy.json", "text_encoder.safetensors", "transformer/config.json"):
            assert f"{checkpoint}/{name}" in names
        assert any(n.startswith(f"{checkpoint}/transformer/") and n.endswith(".safetensors") for n in names)
        assert [n for n in shipped if n not in names] == [], f"{checkpoint} files missing from the wheel"
    assert {"workers/model/tiny_policy.py", "pipelines/cli.py", "workers/task/data/miniocr_prompts.jsonl"} <= names
