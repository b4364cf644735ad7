"""Any policy from its spec or its folder: the pixel MiniGenEval policy or a diffusers pipeline's adapter.

A policy's `spec()` is what checkpoints and PULSE anchors record ("policy_config"), so any process
can rebuild the architecture and then load the trained weights (`weights()`): the pixel policy's
PolicyConfig fields, or a diffusers ModelSpec (it has a "family").

Example:
    policy = load_any("/models/Qwen-Image", lora_rank=64)        # or a spotlight policy folder
    same = build_from_spec(policy.spec()); same.load_weights(policy.weights())
"""

from __future__ import annotations

from pathlib import Path

from workers.model.families.diffusers_policy import build_model_policy, load_model_policy
from workers.model.families.model_spec import ModelSpec
from workers.model.tiny_policy import Policy, PolicyConfig, build_policy, load_policy

MODEL_FIELDS = (
    "resolution",
    "lora_rank",
    "lora_alpha",
    "guidance",
    "negative_prompt",
    "max_sequence_length",
    "base_dtype",
    "sync_mode",
)
"""What `load_any` accepts for a diffusers folder (ModelSpec's fields besides path and family)."""


def is_model_folder(path: str | Path) -> bool:
    """True for a diffusers pipeline folder (model_index.json), False for a spotlight pixel policy folder."""
    return (Path(path) / "model_index.json").is_file()


def build_from_spec(spec: dict, empty: bool = False):
    """The (randomly initialised, or base-weight) policy a checkpoint's or anchor's `policy_config` describes.
    `empty`: its parameters on the meta device instead (no weights read or allocated), for an FSDP2 rank that
    receives its shards from rank 0 (workers/trainer/sharded_load.py)."""
    if "family" in spec:
        return build_model_policy(ModelSpec.from_json(spec), empty)
    config = PolicyConfig(**{**spec, "rope_axes": tuple(spec["rope_axes"])})
    if not empty:
        return build_policy(config)
    from accelerate import init_empty_weights

    with init_empty_weights():  # parameters only: buffers stay real
        return build_policy(config)


def load_any(path: str | Path, **model_fields):
    """A spotlight policy folder (policy.json) or a diffusers pipeline folder (model_index.json, with ModelSpec
    fields such as lora_rank and resolution); a folder that is neither fails before any weights load."""
    unknown = set(model_fields) - set(MODEL_FIELDS)
    if unknown:
        raise TypeError(f"unknown model fields {sorted(unknown)}; expected some of {MODEL_FIELDS}")
    given = {k: v for k, v in model_fields.items() if v is not None}
    if is_model_folder(path) or (given and not (Path(path) / "policy.json").is_file()):
        return load_model_policy(path, **given)  # a folder that is not a pipeline gets detect_family's error
    if given:
        raise ValueError(
            f"{path} is a spotlight pixel policy: {sorted(given)} apply to diffusers pipelines (--model DIR)"
        )
    return load_policy(path)


__all__ = ["Policy", "build_from_spec", "is_model_folder", "load_any"]
