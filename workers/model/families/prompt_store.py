"""Prompt embeddings in the tensor store: the coordinator encodes each prompt of a run once, rollout workers read them,
so a worker that finds them loads only the transformer and the VAE, never the text encoder(s).

One commit per prompt at `prompt_embeddings_key(run, prompt)`: the family's `encode` output for that prompt alone
(FP32, unpadded: `prompt_embeds`, plus `pooled` for SD3 and FLUX.1), safetensors, and a manifest naming the prompt
and the encoder settings that shaped it (family, max_sequence_length, base_dtype). True-CFG families also get the
negative prompt's, since a request may ask for guidance > 1. A reader whose settings differ, or a prompt with no
commit, falls back to encoding it itself (correct, just slower); a malformed commit is a ValueError.

Example:
    publish_run_prompt_embeddings(store, "demo", prompts)        # coordinator: the run's spec from its anchor
    attach_prompt_store(policy, store, "demo")                   # rollout worker (PolicyHolder does this)
    policy.encode_prompts(["two red circles"])                   # read from the store, no text encoder loaded
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable

import torch

from resources.keys import prompt_embeddings_key
from resources.store.base import TensorStore
from resources.store.chain import StoreChain
from workers.model.families.diffusers_policy import shared_frozen_parts
from workers.model.families.model_spec import ModelSpec
from workers.model.families.registry import family_for

FORMAT = "spotlight-prompt-embeddings/1"


def encoder_settings(spec: ModelSpec) -> dict:
    """What shapes a prompt's embeddings besides the folder: a reader with other settings re-encodes."""
    return {"family": spec.family, "max_sequence_length": spec.max_sequence_length, "base_dtype": spec.base_dtype}


def prompts_to_cache(spec: ModelSpec, prompts: Iterable[str]) -> list[str]:
    """The prompts, plus the negative prompt of true CFG (any request may ask for guidance > 1)."""
    family = family_for(spec.family)
    extra = [family.negative_prompt_for(spec)] if family.uses_true_cfg else []
    return list(dict.fromkeys([*prompts, *extra]))


@dataclass
class PromptCacheOutcome:
    num_prompts: int
    """Prompts asked for (with the negative prompt of true CFG)."""
    num_written: int
    """Prompts encoded and committed by this call (the rest were in the store already)."""
    size_bytes: int
    """Bytes of the embeddings this call committed."""
    encode_s: float
    """Seconds spent loading the text encoder(s) and encoding (0 when nothing was missing)."""


def publish_prompt_embeddings(
    store: TensorStore, run: str, spec: ModelSpec, prompts: Iterable[str]
) -> PromptCacheOutcome:
    """Encode every prompt the store lacks (text encoders load only if one is missing) and commit each."""
    wanted = prompts_to_cache(spec, prompts)
    source = StorePromptSource(store, run)
    missing = [p for p in wanted if not source.has(p, spec)]
    if not missing:
        return PromptCacheOutcome(len(wanted), 0, 0, 0.0)
    started = time.perf_counter()
    frozen = shared_frozen_parts(spec, family_for(spec.family))
    previous, frozen.prompt_source = frozen.prompt_source, None  # encode here: never echo the store back into it
    try:
        encoded = frozen.embeddings(missing)
    finally:
        frozen.prompt_source = previous
    encode_s = time.perf_counter() - started
    size = publish_encoded(store, run, spec, {p: encoded[p] for p in missing})
    return PromptCacheOutcome(len(wanted), len(missing), size, encode_s)


def publish_encoded(store: TensorStore, run: str, spec: ModelSpec, encoded: dict[str, dict[str, torch.Tensor]]) -> int:
    """Commit each prompt's embeddings (encoded by `spec`'s text encoders); returns the bytes committed."""
    size = 0
    for prompt, tensors in encoded.items():
        meta = {"format": FORMAT, "prompt": prompt, **encoder_settings(spec)}
        published = store.publish_tensors(prompt_embeddings_key(run, prompt), tensors, meta)
        size += sum(entry.size_bytes for entry in published.manifest.objects.values())
    return size


def publish_run_prompt_embeddings(store: TensorStore, run: str, prompts: Iterable[str]) -> PromptCacheOutcome | None:
    """`publish_prompt_embeddings` with the ModelSpec the run's first anchor records; None for a run of the pixel
    policy (its prompts are token ids, nothing to cache) or a run with no anchor yet."""
    chain = StoreChain(store, run)
    anchors = chain.anchor_versions()
    config = chain.anchor_metadata(anchors[0]).get("policy_config") if anchors else None
    if not isinstance(config, dict) or "family" not in config:
        return None
    return publish_prompt_embeddings(store, run, ModelSpec.from_json(config), prompts)


class StorePromptSource:
    """A FrozenParts' `prompt_source`: reads a run's cached prompt embeddings from the store."""

    def __init__(self, store: TensorStore, run: str):
        self.store, self.run = store, run
        self.num_read = 0
        """Prompts this source supplied (read from the store)."""

    def has(self, prompt: str, spec: ModelSpec) -> bool:
        manifest = self.store.read_manifest(prompt_embeddings_key(self.run, prompt))
        return manifest is not None and _matches(manifest.metadata, prompt, spec)

    def read(self, prompts: list[str], spec: ModelSpec) -> dict[str, dict[str, torch.Tensor]]:
        """The embeddings of those `prompts` the store holds for `spec`'s encoder settings (others are left out)."""
        names = set(family_for(spec.family).embedding_names)
        found = {}
        for prompt in prompts:
            key = prompt_embeddings_key(self.run, prompt)
            manifest = self.store.read_manifest(key)
            if manifest is None or not _matches(manifest.metadata, prompt, spec):
                continue
            tensors = self.store.load_tensors(key)
            if set(tensors) != names or any(t.dtype != torch.float32 or t.ndim not in (1, 2) for t in tensors.values()):
                raise ValueError(
                    f"cached prompt embeddings at {key} hold {sorted(tensors)} "
                    f"({[str(t.dtype) for t in tensors.values()]}); a {spec.family} prompt needs FP32 "
                    f"{sorted(names)}: delete the commit and let the coordinator write it again"
                )
            found[prompt] = tensors
        self.num_read += len(found)
        return found


def _matches(meta: dict, prompt: str, spec: ModelSpec) -> bool:
    return (
        meta.get("format") == FORMAT
        and meta.get("prompt") == prompt
        and all(meta.get(k) == v for k, v in encoder_settings(spec).items())
    )


def attach_prompt_store(policy, store: TensorStore, run: str) -> None:
    """Make a diffusers policy read `run`'s cached prompt embeddings before encoding any prompt itself (a no-op
    for the pixel policy)."""
    frozen = getattr(policy, "frozen", None)
    if frozen is not None:
        frozen.prompt_source = StorePromptSource(store, run)
