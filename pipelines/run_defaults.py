"""What a run's model folder and device decide where no preset name, file, variable or flag says otherwise.

- **The family decides the preset.** `--model DIR` without `--preset`: the folder's family (its model_index.json,
  read before any weights) picks its GPU recipe (FAMILY_PRESETS), never the tiny CPU preset; a tiny test pipeline
  (a transformer narrower than TINY_WIDTH) keeps the command's CPU default.
- **A GPU run injects no preemptions** (workers.preemptions_per_hour 0) unless a layer asks for them.
- **One GPU, held by the trainer:** the trainer's process samples (deployment.rollouts inprocess): no GPU is left
  for a local worker (resources/cluster/placement.py).

Each value decided here carries its reason as its origin, so `spotlight config --explain` says where it came from.

Example:
    layers = [*family_layers(layers, "cpu_tiny_spot"), *layers]       # before resolving
    extra = device_layer(resolved, gpu_count=1)                        # after: resolve again with it, if any
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

from resources.settings.resolve import DEFAULT_ORIGIN, PRESET_ORIGIN, ConfigError, Layer, Resolved

FAMILY_PRESETS = {"sd3": "sd35m_lora", "qwen-image": "qwen_image_lora", "flux": "flux1_lora"}
"""Model family (workers/model/families/identify.py) -> the preset of its published recipe."""
TINY_WIDTH = 512
"""A transformer narrower than this (heads x head dim) is a tiny test pipeline (workers/model/families/tiny.py):
it keeps the command's CPU preset. Every released family is 1536 wide or more (SD3.5-M 24 x 64, FLUX.1 and
Qwen-Image 24 x 128)."""
UNSET = (PRESET_ORIGIN, DEFAULT_ORIGIN)
"""Origins that mean no layer set the value."""


def family_layers(layers: Sequence[Layer], default_preset: str) -> list[Layer]:
    """[a layer naming the preset the `--model` folder's family decides], when a layer names a folder and none a
    preset; [] otherwise. ConfigError naming the folder when its family cannot be read."""
    if any("preset" in layer.values for layer in layers):
        return []
    given = [layer for layer in layers if layer.values.get("model.model")]
    if not given:
        return []
    where = given[-1].where["model.model"]
    folder = Path(given[-1].values["model.model"]).expanduser()
    preset, why = family_preset(folder, default_preset, where)
    return [Layer("model family", {"preset": preset}, {"preset": why})]


def family_preset(folder: Path, default_preset: str, where: str = "--model") -> tuple[str, str]:
    """(preset, why) for a diffusers pipeline folder: its family's recipe, or `default_preset` for a tiny one."""
    from workers.model.families.identify import UnsupportedModelError, detect_family

    try:
        family = detect_family(folder)
    except UnsupportedModelError as err:
        raise ConfigError(f"{where}: {err}; its family chooses the preset, or pass --preset") from None
    width = transformer_width(folder)
    if width is not None and width < TINY_WIDTH:
        return default_preset, f"{where}: a tiny {family} pipeline ({width} wide), on the command's CPU preset"
    return FAMILY_PRESETS[family], f"{where}: a {family} pipeline, on its family's preset"


def transformer_width(folder: Path) -> Optional[int]:
    """The transformer's width (attention heads x head dim) from its config.json; None when it does not say."""
    try:
        config = json.loads((folder / "transformer" / "config.json").read_text())
        return int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cuda_count() -> int:
    """The CUDA devices torch sees here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_layer(resolved: Resolved, gpu_count: Optional[int] = None) -> Optional[Layer]:
    """The values a new run's device decides (none set by a layer): no injected preemptions off the CPU, and
    in-process rollouts when the trainer's ranks hold every GPU of this machine; None when there are none.
    `gpu_count`: CUDA devices here (None: ask torch, only for a CUDA run)."""
    from resources.cluster.placement import free_gpus

    config, origins = resolved.config, resolved.origins
    train, workers, deployment = config.train, config.workers, config.deployment
    unset = lambda key: origins.get(key, DEFAULT_ORIGIN) in UNSET  # noqa: E731
    layer = Layer(f"train.device {train.device}")
    if train.device != "cpu" and workers.preemptions_per_hour and unset("workers.preemptions_per_hour"):
        layer.values["workers.preemptions_per_hour"] = 0.0
        layer.where["workers.preemptions_per_hour"] = (
            f"train.device {train.device}: a GPU run injects no preemptions (set workers.preemptions_per_hour to "
            "ask for some)"
        )
    on_redis = (deployment.queue or "").startswith(("redis://", "rediss://"))
    if train.device.startswith("cuda") and deployment.rollouts == "local_pool" and not on_redis:
        count = cuda_count() if gpu_count is None else gpu_count
        if count and not free_gpus(train.device, train.nproc, count):
            why = f"the trainer holds this machine's {count} GPU(s) and none is left for a local worker"
            if not unset("deployment.rollouts"):
                raise ConfigError(
                    f"{origins['deployment.rollouts']}: deployment.rollouts local_pool on {train.device}: {why}; "
                    "let the trainer sample (--rollouts inprocess), train on fewer GPUs (--nproc), or sample with "
                    "remote workers on a Redis queue (--queue redis://...)"
                )
            layer.values["deployment.rollouts"] = "inprocess"
            layer.where["deployment.rollouts"] = f"train.device {train.device}: {why}, so the trainer samples"
    return layer if layer.values else None
