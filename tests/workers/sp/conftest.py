"""Fixtures of the SP tests: a tiny Qwen-Image pipeline that SP groups can split (helpers: tiny_run.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def qwen4(tmp_path_factory) -> Path:
    from workers.model.families.tiny import build_tiny_pipeline

    return build_tiny_pipeline("qwen-image", tmp_path_factory.mktemp("qwen4") / "qwen", num_heads=4)
