"""Which model family a local diffusers folder holds, read from its `model_index.json` before any weights load."""

from __future__ import annotations

import json
from pathlib import Path

PIPELINE_FAMILIES = {
    "QwenImagePipeline": "qwen-image",
    "StableDiffusion3Pipeline": "sd3",
    "FluxPipeline": "flux",
}
"""diffusers pipeline class (model_index.json's `_class_name`) -> spotlight family."""


class UnsupportedModelError(ValueError):
    """The folder is not a diffusers pipeline spotlight can post-train; the message says why and what is."""


def detect_family(path: str | Path) -> str:
    """The family of the diffusers pipeline saved in `path` (UnsupportedModelError otherwise)."""
    path = Path(path)
    supported = ", ".join(f"{cls} ({fam})" for cls, fam in PIPELINE_FAMILIES.items())
    index = path / "model_index.json"
    if not path.is_dir():
        raise UnsupportedModelError(
            f"--model {path}: no such folder; pass a diffusers pipeline saved with "
            "save_pretrained (a folder with model_index.json)"
        )
    if not index.is_file():
        raise UnsupportedModelError(
            f"--model {path} holds no model_index.json, so it is not a diffusers pipeline "
            f"folder; spotlight post-trains {supported}"
        )
    try:
        cls = json.loads(index.read_text()).get("_class_name")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as err:
        raise UnsupportedModelError(f"--model {path}: model_index.json is not a JSON object ({err})") from None
    if cls not in PIPELINE_FAMILIES:
        raise UnsupportedModelError(
            f"--model {path} is a {cls!r} pipeline (model_index.json); spotlight post-trains {supported}"
        )
    if not (path / "transformer").is_dir():
        raise UnsupportedModelError(f"--model {path}: the {cls} folder has no transformer/ subfolder")
    return PIPELINE_FAMILIES[cls]
