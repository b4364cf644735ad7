"""A diffusers pipeline as a spotlight policy: the trainable transformer (full, or a peft LoRA on it) and the
frozen rest (text encoder(s), VAE, scheduler), behind the interface the sampler and trainer use.

The interface is the pixel policy's (workers/model/tiny_policy.py): `latent_shape`, `sigmas(num_steps)`,
`encode_prompts(prompts) -> (cond, mask)`, `velocity(x, sigma, cond, mask)`, `decode(latents)`, and
`weights()` / `load_weights()` / `trainable_parameters()` / `spec()` for what trains, syncs and
checkpoints. A family (qwen_image.py, sd3.py, flux.py) supplies the parts that differ: prompt
encoding, latent packing, the transformer's call and CFG, the VAE's scaling.

Memory: the frozen parts are loaded lazily and shared (never deep-copied): the text encoder(s) load
only for a prompt that is neither cached in this process nor in the store's prompt cache
(workers/model/families/prompt_store.py), so a rollout worker fed from the store loads only the
transformer and the VAE; a process that only trains on cached prompt embeddings never loads the VAE;
`drop_text_encoders()` frees the text encoder(s) once every prompt it needs is encoded.

A request may ask for another resolution or guidance than the run's: `policy.at(resolution=..., guidance=...)`
is a view that shares the transformer and the frozen parts (ValueError for a resolution the family cannot
pack, before any compute).

Example:
    policy = load_model_policy("/models/Qwen-Image", lora_rank=64, resolution=512)
    cond, mask = policy.encode_prompts(["a red circle"])
    v = policy.velocity(x_N_seq_C, sigma_N, cond, mask)
    images = policy.decode(latents)                     # (N, 3, 512, 512) in [-1, 1]
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from workers.model.families.family import Conditioning, Family
from workers.model.families.identify import detect_family
from workers.model.families.lora import TRAINED_ADAPTER, adapter_of, add_lora
from workers.model.families.model_spec import ModelSpec
from workers.model.families.registry import family_for

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
MAX_HELD_PROMPTS = 1024
"""Prompt embeddings a process keeps in memory when the store holds them all (Qwen-Image's: about 0.3-1.4 MB each,
FP32); beyond it the cache is emptied and refilled from the store."""
DECODE_BATCH = 8
"""Latents per VAE call unless the caller chunks otherwise (`DiffusersPolicy.decode`)."""


class FrozenParts:
    """The pipeline without its transformer, each part loaded on first use: the text encoder(s) only when a prompt
    is neither cached here nor in the store's prompt cache (`prompt_source`), the VAE only to decode. Shared by deep
    copies (NFT's v_old, the KL reference), so they never duplicate the text encoders or the VAE."""

    def __init__(self, spec: ModelSpec, family: Family):
        self.spec, self.family = spec, family
        self._text_pipe = None
        self._vae = None
        self.device = torch.device("cpu")
        self.text_encoders_dropped = False
        self.prompt_cache: dict[str, dict[str, torch.Tensor]] = {}
        """Prompt -> its embeddings (CPU, unpadded): each prompt is encoded once per process."""
        self.prompt_source = None
        """Where embeddings encoded elsewhere are read from first (`prompt_store.StorePromptSource`), or None."""
        self.loaded: list[str] = []
        """What this process loaded, in order ("text_encoders", "vae"): a worker fed from the store never
        lists "text_encoders"."""

    @property
    def text_pipe(self):
        if self._text_pipe is None:
            self._text_pipe = self.family.load_text_pipeline(self.spec, _DTYPES[self.spec.base_dtype]).to(self.device)
            self.loaded.append("text_encoders")
        return self._text_pipe

    @property
    def vae(self) -> nn.Module:
        if self._vae is None:
            self._vae = self.family.load_vae(self.spec, _DTYPES[self.spec.base_dtype]).to(self.device).eval()
            self.loaded.append("vae")
        return self._vae

    def to(self, device: torch.device) -> None:
        self.device = torch.device(device)
        for part in (self._text_pipe, self._vae):
            if part is not None:
                part.to(self.device)

    def embeddings(self, prompts: list[str]) -> dict[str, dict[str, torch.Tensor]]:
        """Each prompt's embeddings: from this process's cache, else the prompt source, else encoded here.
        One prompt per encoder call, so an embedding never depends on what it was batched with and a worker
        that encodes a prompt itself gets the bits the coordinator stored."""
        needed = [p for p in dict.fromkeys(prompts) if p not in self.prompt_cache]
        if needed and self.prompt_source is not None and len(self.prompt_cache) + len(needed) > MAX_HELD_PROMPTS:
            self.forget_prompts(keep=prompts)  # the store holds them all: read them again when asked
        if needed and self.prompt_source is not None:
            self.prompt_cache.update(self.prompt_source.read(needed, self.spec))
            needed = [p for p in needed if p not in self.prompt_cache]
        if needed and self.text_encoders_dropped:
            raise RuntimeError(
                f"prompts {needed[:3]} are not cached and the text encoders were dropped; "
                "encode every prompt before drop_text_encoders()"
            )
        with torch.no_grad():
            for prompt in needed:
                (encoded,) = self.family.encode(self.text_pipe, [prompt], self.spec, self.device)
                self.prompt_cache[prompt] = {k: v.cpu() for k, v in encoded.items()}
        return {p: self.prompt_cache[p] for p in prompts}

    def drop_text_encoders(self) -> None:
        self._text_pipe = None
        self.text_encoders_dropped = True

    def forget_prompts(self, keep: list[str] = ()) -> None:
        """Drop this process's cached embeddings (but `keep`'s): they are in the store, read again on demand."""
        kept = {p: self.prompt_cache[p] for p in keep if p in self.prompt_cache}
        self.prompt_cache.clear()  # in place: every policy sharing these parts holds this dict
        self.prompt_cache.update(kept)

    def __deepcopy__(self, memo):
        return self


_SHARED: dict[tuple, FrozenParts] = {}


def shared_frozen_parts(spec: ModelSpec, family: Family) -> FrozenParts:
    """One FrozenParts per (folder, what shapes the frozen outputs) in this process: every phase's policy, the
    NFT v_old copy and the KL reference share the text encoders, the VAE and the prompt embeddings."""
    key = (spec.path, spec.base_dtype, spec.max_sequence_length, spec.resolution)
    if key not in _SHARED:
        _SHARED.clear()  # one model per process: a new one releases the last one's encoders and VAE
        _SHARED[key] = FrozenParts(spec, family)
    return _SHARED[key]


class DiffusersPolicy(nn.Module):
    def __init__(self, spec: ModelSpec, family: Family, transformer: nn.Module, frozen: FrozenParts | None = None):
        super().__init__()
        self.model_spec, self.family = spec, family
        self.transformer = transformer
        self.frozen = frozen or shared_frozen_parts(spec, family)
        self._prompt_cache = self.frozen.prompt_cache
        self._sigma_cache: dict[int, torch.Tensor] = {}
        self.geometry = family.geometry(spec)
        self.row_negatives: dict[str, str] = {}
        """Prompt -> its own negative prompt under true CFG (a prompts file row's `negative_prompt`); a prompt not
        here uses the run's (`Family.negative_prompt_for`)."""

    # -- what the sampler walks --------------------------------------------------------------------
    @property
    def latent_shape(self) -> tuple[int, ...]:
        return self.geometry.latent_shape

    def sigmas(self, num_steps: int, shift: float = 1.0) -> torch.Tensor:
        """The family's own schedule (its scheduler config: static shift, or the resolution-dependent dynamic
        shift); `shift` is the pixel policy's knob and is ignored here."""
        if num_steps not in self._sigma_cache:
            self._sigma_cache[num_steps] = self.family.sigmas(self.model_spec, self.geometry, num_steps)
        return self._sigma_cache[num_steps]

    def at(self, resolution: int | None = None, guidance: float | None = None) -> "DiffusersPolicy":
        """This policy at another resolution and/or guidance (None keeps the spec's): a view sharing the
        transformer, its weights and the frozen parts. ValueError, before any compute, for a resolution that is
        not a multiple of the family's latent stride (VAE factor x patch size)."""
        import dataclasses

        changes = {
            name: value
            for name, value in (("resolution", resolution), ("guidance", guidance))
            if value is not None and value != getattr(self.model_spec, name)
        }
        if not changes:
            return self
        spec = dataclasses.replace(self.model_spec, **changes)
        view = DiffusersPolicy(spec, self.family, self.transformer, self.frozen).train(self.training)
        view.row_negatives = self.row_negatives
        return view

    # -- prompts -------------------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str]) -> tuple[Conditioning, None]:
        """The batch's conditioning (and the unconditional one under true CFG): each prompt's embeddings come from
        the store's prompt cache when there is one, else the pipeline's frozen text encoder(s), once per process."""
        default = self.family.negative_prompt_for(self.model_spec)
        negatives = [self.row_negatives.get(p, default) for p in prompts]
        cfg = self.model_spec.guidance > 1 and self.family.uses_true_cfg
        found = self.frozen.embeddings(list(dict.fromkeys([*prompts, *negatives])) if cfg else list(prompts))
        cond = self.family.collate([found[p] for p in prompts], self.device)
        uncond = self.family.collate([found[n] for n in negatives], self.device) if cfg else None
        return Conditioning(cond, uncond), None

    def cache_prompt_embeddings(self, embeddings: dict[str, dict[str, torch.Tensor]]) -> None:
        """Seed the cache with embeddings encoded elsewhere (a worker that never loads the text encoders)."""
        self._prompt_cache.update(embeddings)

    def prompt_embeddings(self, prompts: list[str]) -> dict[str, dict[str, torch.Tensor]]:
        return self.frozen.embeddings(prompts)

    def drop_text_encoders(self) -> None:
        self.frozen.drop_text_encoders()

    # -- the model -----------------------------------------------------------------------------------
    def velocity(self, x: torch.Tensor, sigma_N: torch.Tensor, cond: Conditioning, mask=None) -> torch.Tensor:
        """The flow-matching velocity (noise - data) at noise level sigma, with the family's guidance."""
        spec = self.model_spec
        with self._cache_branch("cond"):
            v = self.family.forward(self.transformer, x, sigma_N, cond.cond, self.geometry, spec)
        if cond.uncond is None:
            return v
        with self._cache_branch("uncond"):
            v_uncond = self.family.forward(self.transformer, x, sigma_N, cond.uncond, self.geometry, spec)
        # FP32 here: under BF16 autocast the guided difference (scale x (v_cond - v_uncond)) would round in BF16
        with torch.autocast(v.device.type, enabled=False):
            return self.family.combine_cfg(v.float(), v_uncond.float(), spec.guidance)

    def _cache_branch(self, name: str):
        """A diffusers cache hook (exploration's cheap levels) keeps one cache per guidance branch, as diffusers'
        own pipelines do: the conditional and unconditional passes differ in text length and must never reuse
        each other's cached residuals. Without a hook, nothing."""
        import contextlib

        if getattr(self.transformer, "is_cache_enabled", False):
            return self.transformer.cache_context(name)
        return contextlib.nullcontext()

    @torch.no_grad()
    def decode(self, latents: torch.Tensor, batch_size: int = DECODE_BATCH) -> torch.Tensor:
        """Latents (N, *latent_shape) -> images (N, 3, H, W) in [-1, 1], through the VAE, `batch_size` latents per
        VAE call: the VAE's activations (about 1.7 GB per 512-px image in BF16 for Qwen-Image's) are held for one
        chunk only. Images come back on the CPU, as float32."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1 (latents per VAE call), got {batch_size}")
        vae = self.frozen.vae
        vae_dtype = next(vae.parameters()).dtype
        chunks = []
        for start in range(0, latents.shape[0], batch_size):
            part = latents[start : start + batch_size].to(self.frozen.device, vae_dtype)
            chunks.append(self.family.decode(vae, part, self.geometry).float().clamp(-1, 1).cpu())
        return torch.cat(chunks) if chunks else latents.new_zeros((0, 3, self.geometry.height, self.geometry.width))

    def enable_vae_tiling(self) -> None:
        """Decode each image in overlapping tiles (diffusers' `enable_tiling`, which the Qwen-Image, SD3 and FLUX.1
        VAEs have): memory bounded at any resolution, at the cost of blended tile seams."""
        vae = self.frozen.vae
        if not callable(getattr(vae, "enable_tiling", None)):
            raise ValueError(f"{type(vae).__name__} has no tiled decoding (enable_tiling)")
        vae.enable_tiling()

    @property
    def device(self) -> torch.device:
        return next(self.transformer.parameters()).device

    def to(self, *args, **kwargs):
        super().to(*args, **kwargs)
        self.frozen.to(self.device)
        return self

    # -- what trains, syncs and checkpoints ----------------------------------------------------------
    @property
    def is_lora(self) -> bool:
        return self.model_spec.lora_rank > 0

    def weights(self) -> dict[str, torch.Tensor]:
        """The trained LoRA adapter's tensors under LoRA (not a frozen adapter beside it, such as NFT's v_old), else
        the transformer's whole state dict."""
        state = self.transformer.state_dict()
        if self.is_lora:
            return {k: v for k, v in state.items() if adapter_of(k) == TRAINED_ADAPTER}
        return state

    def load_weights(self, tensors: dict[str, torch.Tensor], assign: bool = False) -> None:
        """Copy `tensors` into the weights; `assign`: make them the parameters (their dtype, their memory)."""
        expected = set(self.weights())
        if set(tensors) != expected:
            missing, extra = sorted(expected - set(tensors))[:3], sorted(set(tensors) - expected)[:3]
            raise ValueError(
                f"weights do not match this {self.model_spec.family} policy "
                f"(missing {missing}, unexpected {extra}): were they saved with another --lora-rank?"
            )
        self.transformer.load_state_dict(tensors, strict=not self.is_lora, assign=assign)

    def trainable_parameters(self):
        return [p for p in self.transformer.parameters() if p.requires_grad]

    def spec(self) -> dict:
        return self.model_spec.to_json()


def build_model_policy(spec: ModelSpec, empty: bool = False) -> DiffusersPolicy:
    """The policy `spec` describes: the folder's transformer (FP32 masters, or a frozen base plus an FP32 LoRA).
    `empty`: parameters on the meta device, no weights read (`Family.load_transformer`)."""
    family = family_for(spec.family)
    dtype = torch.float32 if spec.lora_rank == 0 else _DTYPES[spec.base_dtype]
    transformer = family.load_transformer(spec, dtype, empty)
    if spec.lora_rank:
        add_lora(transformer, spec, family.lora_targets)
    return DiffusersPolicy(spec, family, transformer).eval()


def load_model_policy(path: str | Path, **fields) -> DiffusersPolicy:
    """Load a local diffusers pipeline folder as a policy; bad folders fail before any weights load."""
    path = Path(path).resolve()
    family = detect_family(path)
    spec = ModelSpec(path=str(path), family=family, **fields)
    family_for(family).geometry(spec)  # a resolution the family cannot pack fails here, before weights load
    return build_model_policy(spec)


def save_model_policy(policy: DiffusersPolicy, out: str | Path) -> Path:
    """The trained part, in the form diffusers loads the standard way, plus spec.json (its base folder):
    - LoRA: `out/lora/pytorch_lora_weights.safetensors`, written by the family pipeline's own `save_lora_weights`
      (keys under `transformer.`, the LoRA config (rank, alpha, targets) in the file's metadata), so
      `Pipeline.from_pretrained(base).load_lora_weights(out / "lora")` gives the trained transformer;
    - full fine-tuning: `out/transformer/`, for `TransformerClass.from_pretrained(out / "transformer")`."""
    import json

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if policy.is_lora:
        save_lora_folder(policy, out / "lora")
    else:
        policy.transformer.save_pretrained(out / "transformer", safe_serialization=True)
    (out / "spec.json").write_text(json.dumps(policy.spec(), indent=2))
    return out


def save_lora_folder(policy: DiffusersPolicy, folder: Path) -> None:
    """The trained adapter through the family pipeline's `save_lora_weights` (what its `load_lora_weights` reads)."""
    import diffusers
    from peft import get_peft_model_state_dict

    transformer = policy.transformer
    layers = get_peft_model_state_dict(transformer, adapter_name=TRAINED_ADAPTER)
    config = transformer.peft_config[TRAINED_ADAPTER].to_dict()
    metadata = {k: sorted(v) if isinstance(v, set) else v for k, v in config.items()}  # JSON has no sets
    pipeline_class = getattr(diffusers, policy.family.pipeline_class)
    pipeline_class.save_lora_weights(
        folder, transformer_lora_layers=layers, transformer_lora_adapter_metadata=metadata, safe_serialization=True
    )
