"""A pipeline folder's parts counted on the meta device: every part built from its own config.json with nothing
allocated and no weight read (accelerate's `init_empty_weights`), so a 20B model is counted in seconds on any machine.

What the memory plan (workers/trainer/memory_plan.py) needs: the transformer's parameters and its width, the LoRA's
parameters on the family's targets, each text encoder's and the VAE's parameters.

Example:
    sizes = model_sizes("/models/Qwen-Image", lora_rank=64)
    sizes.transformer_params, sizes.lora_params, sizes.text_encoder_params
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from workers.model.families.identify import detect_family
from workers.model.families.registry import family_for
from workers.trainer.fsdp import transformer_blocks


@dataclass(frozen=True)
class ModelSizes:
    family: str
    transformer_params: int
    num_blocks: int
    """Transformer blocks (Qwen-Image: 60; FLUX.1: 19 double + 38 single)."""
    hidden_size: int
    """Width of the stream every block carries (num_attention_heads x attention_head_dim)."""
    lora_params: int
    """Parameters a LoRA of the asked rank adds on the family's targets (0 for full fine-tuning)."""
    text_encoder_params: int
    vae_params: int


def model_sizes(path: str | Path, lora_rank: int = 0) -> ModelSizes:
    """Count the folder's parts on the meta device (ValueError for a folder that is not a known pipeline)."""
    import diffusers
    from accelerate import init_empty_weights

    path = Path(path)
    family = family_for(detect_family(path))
    cls = getattr(diffusers, family.transformer_class)
    config = cls.load_config(path, subfolder="transformer", local_files_only=True)
    with init_empty_weights():
        transformer = cls.from_config(config)
    blocks = len(transformer_blocks(transformer))
    hidden = int(config["num_attention_heads"]) * int(config["attention_head_dim"])
    index = json.loads((path / "model_index.json").read_text())
    encoders = sum(_part_params(path, name, index[name]) for name in family.text_encoder_names if name in index)
    return ModelSizes(
        family=family.name,
        transformer_params=_count(transformer),
        num_blocks=blocks,
        hidden_size=hidden,
        lora_params=lora_params(transformer, family.lora_targets, lora_rank),
        text_encoder_params=encoders,
        vae_params=_part_params(path, "vae", index["vae"]),
    )


def lora_params(transformer: nn.Module, targets: tuple[str, ...], rank: int) -> int:
    """rank x (in + out) for every Linear peft's LoRA would wrap (the names `add_lora` matches)."""
    if rank <= 0:
        return 0
    total = 0
    for name, module in transformer.named_modules():
        if isinstance(module, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets):
            total += rank * (module.in_features + module.out_features)
    return total


def clip_params(path: str | Path) -> int:
    """Parameters of a CLIP reward model folder (its config.json), counted on the meta device."""
    import transformers
    from accelerate import init_empty_weights

    config = transformers.CLIPConfig.from_pretrained(path, local_files_only=True)
    with init_empty_weights():
        return _count(transformers.CLIPModel(config))


def _part_params(path: Path, subfolder: str, entry: list) -> int:
    """Parameters of one pipeline part (a transformers or diffusers class, as model_index.json names it)."""
    import diffusers
    import transformers
    from accelerate import init_empty_weights

    library, name = entry
    folder = path / subfolder
    if library == "transformers":
        cls = getattr(transformers, name)
        config = cls.config_class.from_pretrained(folder, local_files_only=True)
        with init_empty_weights():
            return _count(cls._from_config(config))
    if library == "diffusers":
        cls = getattr(diffusers, name)
        with init_empty_weights():
            return _count(cls.from_config(cls.load_config(folder, local_files_only=True)))
    raise ValueError(f"{folder}: model_index.json names {library}.{name}, neither a transformers nor a diffusers class")


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
