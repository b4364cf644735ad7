"""The supported model families by name."""

from __future__ import annotations

from workers.model.families.family import Family
from workers.model.families.flux import Flux
from workers.model.families.qwen_image import QwenImage
from workers.model.families.sd3 import StableDiffusion3

FAMILIES: dict[str, Family] = {f.name: f for f in (QwenImage(), StableDiffusion3(), Flux())}


def family_for(name: str) -> Family:
    if name not in FAMILIES:
        raise ValueError(f"unknown model family {name!r}; supported: {sorted(FAMILIES)}")
    return FAMILIES[name]
