"""A rollout worker's copy of the policy, kept at the version a request asks for through PULSE.

The first request of a run loads the nearest full anchor (and builds the model from the
architecture recorded in the anchor's manifest); later requests at a newer version apply
only the PULSE patches in between. Every reached version is checked against the sender's
weights hash (`sync_weights`).

Where the weights live (`resident_dtype`):
- "bf16": the model's parameters ARE the BF16 weights PULSE patches in place. The model is
  built on the meta device and the anchor's tensors become its parameters, so a
  merged-sync 20B receiver holds 40 GB, not 40 GB of BF16 plus 80 GB of FP32. The model
  then runs its forwards under BF16 autocast only (a request asking for FP32 forwards is
  refused before any compute).
- "fp32": a separate dict of BF16 weights is patched and copied into a model built on FP32
  copies of them, as the trainer's forward pass under BF16 autocast sees them (any forward
  dtype; the CPU tests' bit-exact path).
- "auto" (the default): bf16 on CUDA devices, where sampling autocasts to BF16 anyway;
  fp32 elsewhere.

A diffusers policy reads the run's cached prompt embeddings from the store
(workers/model/families/prompt_store.py), so a worker loads its text encoder(s) only for a
prompt the coordinator did not cache. `policy_for(spec)` serves a request's own resolution
and guidance from the same weights.

Example:
    holder = PolicyHolder(store, resident_dtype="bf16")
    policy = holder.policy_at("demo", 7)        # anchor 0 + patches 1..7 on first use
    policy = holder.policy_for(rollout_spec)    # the same weights at the request's resolution and guidance
"""

from __future__ import annotations

import time

import torch

from resources.store.base import TensorStore
from resources.store.chain import StoreChain
from workers.algo.sampler import SamplerConfig, resolve_forward_dtype
from workers.model.families.prompt_store import attach_prompt_store
from workers.model.policy_loader import build_from_spec
from workers.model.tiny_policy import Policy
from workers.pulse import ChainConfig, ChainPublisher, sync_weights
from workers.rollout.config import RESIDENT_DTYPES
from workers.task.request_fields import check_policy_reads


class ModelMismatchError(ValueError):
    """The run trains another model than the one this worker was started for (`--model`)."""


def resolve_resident_dtype(resident_dtype: str, device: torch.device) -> str:
    """ "auto" -> "bf16" on CUDA (sampling autocasts to BF16 there anyway), "fp32" elsewhere; others unchanged."""
    if resident_dtype not in RESIDENT_DTYPES:
        raise ValueError(f"resident_dtype (--resident-dtype) must be one of {RESIDENT_DTYPES}, got {resident_dtype!r}")
    if resident_dtype != "auto":
        return resident_dtype
    return "bf16" if device.type == "cuda" else "fp32"


class PolicyHolder:
    """Holds one policy and the BF16 weights PULSE patches; moves them between versions."""

    def __init__(
        self, store: TensorStore, device: str = "cpu", model: str | None = None, resident_dtype: str = "auto"
    ) -> None:
        self.store = store
        self.device = torch.device(device)
        self.model = model
        """The diffusers pipeline folder this worker serves (`--model`); None: whatever a run's anchor names."""
        self.resident_dtype = resolve_resident_dtype(resident_dtype, self.device)
        """bf16: the policy's parameters are the patched weights; fp32: a BF16 dict copied into FP32 parameters."""
        self.run: str | None = None
        self.version: int | None = None
        self.policy: Policy | None = None
        self._weights: dict[str, torch.Tensor] = {}
        """What PULSE patches: the policy's own parameters (bf16), or a separate BF16 dict (fp32)."""
        self._views: dict[tuple, Policy] = {}
        self.last_sync_s = 0.0

    def policy_at(self, run: str, version: int) -> Policy:
        """The policy at `version` of `run` (LookupError when the store has no anchor to start from)."""
        if run == self.run and version == self.version:
            return self.policy
        started = time.perf_counter()
        chain = StoreChain(self.store, run)
        if run != self.run:
            self.run, self.version, self.policy, self._weights = run, None, None, {}
        anchors = [v for v in chain.anchor_versions() if v <= version]
        if not anchors:
            raise LookupError(
                f"run {run!r} has no anchor at or before version {version} in {self.store.url}; "
                "publish the policy first (StoreChain + ChainPublisher)"
            )
        meta = chain.anchor_metadata(anchors[-1])
        config = ChainConfig(anchor_every=int(meta.get("anchor_every", 10)))
        current = self.version if self.version is not None and self.version <= version else None
        self.version = None  # until the hash check passes: a refused chain leaves no version to serve
        if self.policy is None:
            _check_model(meta.get("policy_config"), run, self.model)
            current = self._build(meta, run, chain, anchors[-1])
        sync_weights(self._weights, current, version, chain, config)
        if self.resident_dtype == "fp32":
            with torch.no_grad():
                for name, tensor in self.policy.weights().items():
                    tensor.copy_(self._weights[name].to(tensor.dtype))
        self.version = version
        self.last_sync_s = time.perf_counter() - started
        return self.policy

    def _build(self, meta: dict, run: str, chain: StoreChain, anchor: int) -> int | None:
        """Build the run's policy; returns the version its weights already hold (None: nothing synced yet)."""
        self._views = {}
        if self.resident_dtype == "bf16":
            self.policy = build_bf16_receiver(_policy_config(meta, run), chain.get_anchor(anchor))
            self.policy = self.policy.to(self.device).eval()
            self._weights = self.policy.weights()  # views of the parameters: patches land in the model itself
            reached = anchor
        else:
            self.policy = build_from_spec(_policy_config(meta, run)).to(self.device).eval()
            self._weights, reached = {}, None
        attach_prompt_store(self.policy, self.store, run)
        return reached

    def check_forward(self, sampler: SamplerConfig) -> None:
        """ValueError, before any compute, when this holder's BF16 parameters cannot run `sampler`'s forwards."""
        if self.resident_dtype == "bf16" and resolve_forward_dtype(sampler.forward_dtype, self.device) != "bf16":
            raise ValueError(
                f"rollout request: this worker holds BF16 weights (--resident-dtype bf16) and runs BF16 forwards "
                f"only; the request's sampler forward_dtype={sampler.forward_dtype!r} means FP32 on "
                f"{self.device}: set forward_dtype 'bf16' or start the worker with --resident-dtype fp32"
            )

    def policy_for(self, spec) -> Policy:
        """The policy at a RolloutSpec's version, resolution and guidance (None: the run's ModelSpec). ValueError,
        before any sampling, for a field the policy cannot serve (a resolution the family cannot pack; either
        field on the pixel policy, which has one size and no guidance; FP32 forwards on BF16 weights)."""
        self.check_forward(spec.sampler)
        policy = self.policy_at(spec.run, spec.weights_version)
        check_policy_reads(policy, spec.prompt)
        if spec.resolution is None and spec.guidance is None:
            return policy
        key = (spec.resolution, spec.guidance)
        if key not in self._views:
            if not hasattr(policy, "at"):
                if spec.guidance is None and spec.resolution == policy.config.image_size:
                    return policy
                raise ValueError(
                    f"rollout request: run {spec.run!r} trains the pixel policy, which samples at one size "
                    f"with no guidance; drop resolution={spec.resolution} / guidance={spec.guidance}"
                )
            try:
                self._views[key] = policy.at(resolution=spec.resolution, guidance=spec.guidance)
            except ValueError as err:
                raise ValueError(f"rollout request: {err}") from None
        return self._views[key]


def build_bf16_receiver(cfg: dict, anchor: dict[str, torch.Tensor]) -> Policy:
    """The policy `cfg` describes whose synced weights are `anchor`'s BF16 tensors themselves (on the CPU).

    When the synced weights are the whole model (the pixel policy, a full or merged-sync transformer) it is built
    on the meta device, so no FP32 copy is ever allocated; under a LoRA sync the base loads from the folder in its
    base_dtype and the adapter's BF16 tensors replace its FP32 ones. Each anchor tensor is cloned (and the anchor
    emptied) one at a time: the parameters own writable memory and at most one extra tensor is alive.
    """
    whole = "family" not in cfg or int(cfg.get("lora_rank", 0)) == 0
    policy = build_from_spec(cfg, empty=whole)
    names = set(policy.weights())
    if set(anchor) != names:
        missing, extra = sorted(names - set(anchor))[:3], sorted(set(anchor) - names)[:3]
        raise LookupError(f"the anchor does not hold this policy's weights (missing {missing}, unexpected {extra})")
    owned = {name: anchor.pop(name).clone() for name in list(anchor)}
    policy.load_weights(owned, assign=True)
    left = [name for name, p in policy.named_parameters() if p.is_meta]
    if left:
        raise LookupError(f"the anchor leaves parameters without weights: {left[:3]}")
    return policy


def _check_model(cfg, run: str, model: str | None) -> None:
    """ModelMismatchError when the anchor's spec names another model than `model` (None: no check)."""
    if model is None or not isinstance(cfg, dict):
        return
    if "family" not in cfg:
        raise ModelMismatchError(
            f"run {run!r} trains the pixel policy, but this worker was started with --model "
            f"{model}: start it without --model (MODEL empty)"
        )
    if cfg.get("path") != model:
        raise ModelMismatchError(
            f"run {run!r} trains the pipeline at {cfg.get('path')} (its anchor's spec), but this "
            f"worker was started with --model {model}: every node must hold the run's weights at "
            "the run's path; start workers with MODEL set to it"
        )


def _policy_config(meta: dict, run: str) -> dict:
    cfg = meta.get("policy_config")
    if not isinstance(cfg, dict):
        raise LookupError(
            f"run {run!r}: the anchor records no policy_config; publish it with StoreChain(policy_config=...)"
        )
    return cfg


def publish_policy(store: TensorStore, run: str, policy: Policy, version: int = 0, anchor_every: int = 10):
    """Publish `policy` as the first version of `run`'s chain (an anchor); returns the ChainPublisher
    to publish later versions with (`publisher.publish(v, policy.weights())`)."""
    chain = StoreChain(store, run, policy_config=policy.spec(), anchor_every=anchor_every)
    publisher = ChainPublisher(chain, ChainConfig(anchor_every=anchor_every))
    publisher.publish(version, policy.weights())
    return publisher
