"""What differs between model families: the base class the Qwen-Image, SD3 and FLUX.1 adapters fill in."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from workers.model.families.model_spec import ModelSpec


@dataclass(frozen=True)
class Geometry:
    """Where one sample lives at the spec's resolution."""

    height: int
    width: int
    latent_h: int
    """Latent rows (the VAE's output, before any 2x2 packing)."""
    latent_w: int
    latent_shape: tuple[int, ...]
    """One sample's shape as the sampler and the transformer see it (packed for Qwen-Image and FLUX)."""


@dataclass
class Conditioning:
    """The transformer's text inputs for a batch; `uncond` is the negative prompt's under true CFG."""

    cond: dict[str, torch.Tensor]
    uncond: dict[str, torch.Tensor] | None = None


def quiet_loading() -> None:
    """No per-component progress bars from diffusers and transformers: spotlight shows its own progress."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()


def read_config(path: str, subfolder: str) -> dict:
    file = Path(path) / subfolder / "config.json"
    if not file.is_file():
        file = Path(path) / subfolder / "scheduler_config.json"
    return json.loads(file.read_text())


def pack_2x2(latents_NCHW: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W) -> (N, (H/2)(W/2), 4C): the 2x2 patch packing of Qwen-Image and FLUX.1."""
    n, c, h, w = latents_NCHW.shape
    x = latents_NCHW.reshape(n, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(n, (h // 2) * (w // 2), c * 4)


def unpack_2x2(tokens: torch.Tensor, latent_h: int, latent_w: int) -> torch.Tensor:
    n, _, d = tokens.shape
    x = tokens.reshape(n, latent_h // 2, latent_w // 2, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(n, d // 4, latent_h, latent_w)


def pad_stack(rows: list[torch.Tensor], device) -> tuple[torch.Tensor, torch.Tensor]:
    """Variable-length (L_i, D) rows -> (N, max L, D) zero-padded, and the (N, max L) bool mask of real tokens."""
    length = max(r.shape[0] for r in rows)
    out = rows[0].new_zeros((len(rows), length, rows[0].shape[1]))
    mask = torch.zeros((len(rows), length), dtype=torch.bool)
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
        mask[i, : r.shape[0]] = True
    return out.to(device), mask.to(device)


class Family(ABC):
    name: str = ""
    pipeline_class: str = ""
    transformer_class: str = ""
    text_encoder_names: tuple[str, ...] = ("text_encoder",)
    lora_targets: tuple[str, ...] = ()
    uses_true_cfg = True
    """True CFG (a second, unconditional transformer pass) when guidance > 1; False: guidance is an embedding."""
    negative_prompt = ""
    """The unconditional prompt of true CFG when the run names none: what the family's pipeline uses."""
    pipeline_passes_sigmas = True
    """True: the pipeline hands its scheduler `linspace(1, 1/N, N)` as sigmas (QwenImagePipeline, FluxPipeline);
    False: it calls `set_timesteps(N)` (StableDiffusion3Pipeline)."""
    packed = True

    # -- loading -------------------------------------------------------------------------------------
    def load_transformer(self, spec: ModelSpec, dtype: torch.dtype, empty: bool = False) -> torch.nn.Module:
        """The folder's transformer in `dtype`; `empty`: its architecture only, parameters on the meta device (no
        weights read, nothing allocated), for an FSDP2 rank that receives its shards from rank 0."""
        import diffusers

        cls = getattr(diffusers, self.transformer_class)
        quiet_loading()
        if empty:
            from accelerate import init_empty_weights

            config = cls.load_config(spec.path, subfolder="transformer", local_files_only=True)
            with init_empty_weights():  # parameters only: buffers and RoPE tables stay real
                return cls.from_config(config).to(dtype)
        return cls.from_pretrained(
            spec.path, subfolder="transformer", torch_dtype=dtype, local_files_only=True, low_cpu_mem_usage=True
        )  # built on meta, then filled from the checkpoint: one copy at peak, not a random init plus the weights

    def load_text_pipeline(self, spec: ModelSpec, dtype: torch.dtype):
        """The pipeline with its text encoder(s) and tokenizer(s) only (no transformer, no VAE): what encodes
        prompts."""
        import diffusers

        cls = getattr(diffusers, self.pipeline_class)
        quiet_loading()
        return cls.from_pretrained(spec.path, transformer=None, vae=None, torch_dtype=dtype, local_files_only=True)

    def load_vae(self, spec: ModelSpec, dtype: torch.dtype) -> torch.nn.Module:
        """The folder's VAE alone (its class from model_index.json): what decodes latents to images."""
        import diffusers

        library, name = json.loads((Path(spec.path) / "model_index.json").read_text())["vae"]
        cls = getattr(diffusers, name, None)
        if library != "diffusers" or cls is None:
            raise ValueError(f"{spec.path}: model_index.json names the VAE {library}.{name}, not a diffusers class")
        quiet_loading()
        return cls.from_pretrained(spec.path, subfolder="vae", torch_dtype=dtype, local_files_only=True)

    # -- geometry and schedule -----------------------------------------------------------------------
    @abstractmethod
    def vae_scale_factor(self, spec: ModelSpec) -> int:
        """Supplied by each family."""

    def latent_channels(self, spec: ModelSpec) -> int:
        return int(read_config(spec.path, "vae")["latent_channels"])

    def geometry(self, spec: ModelSpec) -> Geometry:
        factor = self.vae_scale_factor(spec)
        stride = factor * (2 if self.packed else int(read_config(spec.path, "transformer").get("patch_size", 1)))
        if spec.resolution % stride:
            raise ValueError(
                f"resolution {spec.resolution} must be a multiple of {stride} for {self.name} "
                f"(the VAE's factor {factor} times the transformer's 2x2 patches)"
            )
        h = w = spec.resolution // factor
        c = self.latent_channels(spec)
        shape = ((h // 2) * (w // 2), 4 * c) if self.packed else (c, h, w)
        return Geometry(spec.resolution, spec.resolution, h, w, shape)

    def sigmas(self, spec: ModelSpec, geometry: Geometry, num_steps: int) -> torch.Tensor:
        """num_steps + 1 sigmas from the folder's own FlowMatchEulerDiscreteScheduler config (static shift,
        or the dynamic shift for this image's token count, then any terminal stretch), ending at 0: the numbers
        the family's pipeline walks, set the way it sets them (`pipeline_passes_sigmas`)."""
        from diffusers import FlowMatchEulerDiscreteScheduler

        scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(
            spec.path, subfolder="scheduler", local_files_only=True
        )
        kwargs = {}
        if scheduler.config.get("use_dynamic_shifting", False):
            kwargs["mu"] = dynamic_shift_mu(scheduler.config, (geometry.latent_h // 2) * (geometry.latent_w // 2))
        if self.pipeline_passes_sigmas:
            scheduler.set_timesteps(sigmas=np.linspace(1.0, 1.0 / num_steps, num_steps), **kwargs)
        else:
            scheduler.set_timesteps(num_steps, **kwargs)
        return scheduler.sigmas.detach().float().cpu()

    # -- per family ----------------------------------------------------------------------------------
    embedding_names: tuple[str, ...] = ("prompt_embeds",)
    """The tensors `encode` returns per prompt (what the store's prompt cache holds)."""

    @abstractmethod
    def encode(self, pipe, prompts: list[str], spec: ModelSpec, device) -> list[dict[str, torch.Tensor]]:
        """Supplied by each family: one dict of `embedding_names` tensors (FP32, unpadded) per prompt, from the
        text pipeline's own encode code."""

    @abstractmethod
    def collate(self, items: list[dict[str, torch.Tensor]], device) -> dict[str, torch.Tensor]:
        """Supplied by each family."""

    @abstractmethod
    def forward(self, transformer, x, sigma_N, cond: dict, geometry: Geometry, spec: ModelSpec) -> torch.Tensor:
        """Supplied by each family."""

    def negative_prompt_for(self, spec: ModelSpec) -> str:
        """The run's negative prompt, else the family pipeline's own default."""
        return self.negative_prompt if spec.negative_prompt is None else spec.negative_prompt

    def combine_cfg(self, v_cond: torch.Tensor, v_uncond: torch.Tensor, scale: float) -> torch.Tensor:
        return v_uncond + scale * (v_cond - v_uncond)

    @abstractmethod
    def decode(self, vae, latents: torch.Tensor, geometry: Geometry) -> torch.Tensor:
        """Supplied by each family: latents -> images with the folder's VAE."""


def dynamic_shift_mu(config, image_seq_len: int) -> float:
    """The pipelines' `calculate_shift`: mu linear in the image's token count."""
    base_len, max_len = config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096)
    base_shift, max_shift = config.get("base_shift", 0.5), config.get("max_shift", 1.15)
    m = (max_shift - base_shift) / (max_len - base_len)
    return image_seq_len * m + base_shift - m * base_len
