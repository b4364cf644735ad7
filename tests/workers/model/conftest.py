"""Fixtures of the model-family tests: one tiny random-init pipeline per family, saved to a folder."""

import pytest

from workers.model.families.tiny import build_tiny_pipeline


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    """family -> the folder of a tiny pipeline of it (built once per test module)."""
    root = tmp_path_factory.mktemp("pipelines")
    return {f: build_tiny_pipeline(f, root / f) for f in ("qwen-image", "sd3", "flux")}
