"""ModelSpec: what any process needs to rebuild a diffusers policy (recorded in checkpoints and PULSE anchors)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

BASE_DTYPES = ("fp32", "bf16")
SYNC_MODES = ("lora", "merged")


@dataclass(frozen=True)
class ModelSpec:
    path: str
    """Absolute path of the local diffusers pipeline folder (loaded with local_files_only=True)."""
    family: str
    """qwen-image, sd3 or flux (workers.model.families.identify)."""
    resolution: int = 512
    """Square image side in pixels; a multiple of the family's latent stride (VAE factor x packing)."""
    lora_rank: int = 0
    """0 = full fine-tuning of the transformer; > 0 = a peft LoRA of this rank on the family's target modules."""
    lora_alpha: float | None = None
    """LoRA scale numerator (None = lora_rank, i.e. scale 1)."""
    guidance: float = 1.0
    """True CFG scale (Qwen-Image, SD3; > 1 runs an unconditional pass too) or FLUX.1-dev's guidance embedding."""
    negative_prompt: str | None = None
    """The unconditional prompt of true CFG; None = the family's pipeline default (Qwen-Image " ", SD3 "")."""
    max_sequence_length: int = 512
    """Text tokens kept per prompt (the families' T5 / Qwen2.5-VL context)."""
    base_dtype: str = "fp32"
    """Dtype of the frozen weights (text encoders, VAE, and the transformer's base under LoRA): bf16 on GPUs."""
    sync_mode: str = "lora"
    """What PULSE ships of a LoRA policy to rollout workers: "lora" (the adapter's BF16 tensors; workers run the base
    plus the adapter) or "merged" (BF16(base + LoRA delta) of every transformer weight; workers run a plain
    transformer, `receiver()`). Checkpoints keep the adapter either way."""

    def __post_init__(self):
        if not Path(self.path).is_absolute():
            raise ValueError(f"ModelSpec.path must be absolute (it crosses process boundaries), got {self.path!r}")
        if self.resolution < 1:
            raise ValueError(f"resolution must be >= 1, got {self.resolution}")
        if self.lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0 (0 = full fine-tuning), got {self.lora_rank}")
        if self.guidance < 0:
            raise ValueError(f"guidance must be >= 0, got {self.guidance}")
        if self.base_dtype not in BASE_DTYPES:
            raise ValueError(f"base_dtype must be one of {BASE_DTYPES}, got {self.base_dtype!r}")
        if self.max_sequence_length < 1:
            raise ValueError(f"max_sequence_length must be >= 1, got {self.max_sequence_length}")
        if self.sync_mode not in SYNC_MODES:
            raise ValueError(f"sync_mode must be one of {SYNC_MODES}, got {self.sync_mode!r}")
        if self.sync_mode == "merged" and self.lora_rank == 0:
            raise ValueError(
                "sync_mode 'merged' merges a LoRA into the base: it needs lora_rank > 0 (full "
                "fine-tuning ships the whole transformer already)"
            )

    def receiver(self) -> "ModelSpec":
        """The policy a rollout worker builds from the PULSE chain: this one, or under sync_mode "merged" the plain
        transformer (no adapter) that the merged weights load into."""
        if self.sync_mode == "lora":
            return self
        return dataclasses.replace(self, lora_rank=0, lora_alpha=None, sync_mode="lora")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> "ModelSpec":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(raw) - names
        if unknown:
            raise ValueError(f"model spec has unknown fields {sorted(unknown)} (written by a newer spotlight?)")
        return cls(**dict(raw))
