"""A rollout worker's copy of the policy, kept at the version a request asks for through PULSE.

The first request of a run loads the nearest full anchor (and builds the model from the
architecture recorded in the anchor's manifest); later requests at a newer version apply
only the PULSE patches in between. Every reached version is checked against the sender's
weights hash (`sync_weights`). The model runs on FP32 copies of the BF16 weights, as the
trainer's forward pass under BF16 autocast sees them.

A diffusers policy reads the run's cached prompt embeddings from the store
(workers/model/families/prompt_store.py), so a worker loads its text encoder(s) only for a
prompt the coordinator did not cache. `policy_for(spec)` serves a request's own resolution
and guidance from the same weights.

Example:
    holder = PolicyHolder(store)
    policy = holder.policy_at("demo", 7)        # anchor 0 + patches 1..7 on first use
    policy = holder.policy_for(rollout_spec)    # the same weights at the request's resolution and guidance
"""

from __future__ import annotations

import time

import torch

from resources.store.base import TensorStore
from resources.store.chain import StoreChain
from workers.model.families.prompt_store import attach_prompt_store
from workers.model.policy_loader import build_from_spec
from workers.model.tiny_policy import Policy
from workers.pulse import ChainConfig, ChainPublisher, sync_weights
from workers.task.request_fields import check_policy_reads


class ModelMismatchError(ValueError):
    """The run trains another model than the one this worker was started for (`--model`)."""


class PolicyHolder:
    """Holds one policy and the BF16 weights it was loaded from; moves them between versions."""

    def __init__(self, store: TensorStore, device: str = "cpu", model: str | None = None) -> None:
        self.store = store
        self.device = torch.device(device)
        self.model = model
        """The diffusers pipeline folder this worker serves (`--model`); None: whatever a run's anchor names."""
        self.run: str | None = None
        self.version: int | None = None
        self.policy: Policy | None = None
        self._bf16: dict[str, torch.Tensor] = {}
        self._views: dict[tuple, Policy] = {}
        self.last_sync_s = 0.0

    def policy_at(self, run: str, version: int) -> Policy:
        """The policy at `version` of `run` (LookupError when the store has no anchor to start from)."""
        if run == self.run and version == self.version:
            return self.policy
        started = time.perf_counter()
        chain = StoreChain(self.store, run)
        if run != self.run:
            self.run, self.version, self.policy, self._bf16 = run, None, None, {}
        anchors = [v for v in chain.anchor_versions() if v <= version]
        if not anchors:
            raise LookupError(
                f"run {run!r} has no anchor at or before version {version} in {self.store.url}; "
                "publish the policy first (StoreChain + ChainPublisher)"
            )
        meta = chain.anchor_metadata(anchors[-1])
        if self.policy is None:
            _check_model(meta.get("policy_config"), run, self.model)
            self.policy = _build_from(meta, run).to(self.device).eval()
            self._views = {}
            attach_prompt_store(self.policy, self.store, run)
        config = ChainConfig(anchor_every=int(meta.get("anchor_every", 10)))
        current = self.version if self.version is not None and self.version <= version else None
        sync_weights(self._bf16, current, version, chain, config)
        with torch.no_grad():
            for name, tensor in self.policy.weights().items():
                tensor.copy_(self._bf16[name].to(tensor.dtype))
        self.version = version
        self.last_sync_s = time.perf_counter() - started
        return self.policy

    def policy_for(self, spec) -> Policy:
        """The policy at a RolloutSpec's version, resolution and guidance (None: the run's ModelSpec). ValueError,
        before any sampling, for a field the policy cannot serve (a resolution the family cannot pack; either
        field on the pixel policy, which has one size and no guidance)."""
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


def _build_from(meta: dict, run: str) -> Policy:
    cfg = meta.get("policy_config")
    if not isinstance(cfg, dict):
        raise LookupError(
            f"run {run!r}: the anchor records no policy_config; publish it with StoreChain(policy_config=...)"
        )
    return build_from_spec(cfg)


def publish_policy(store: TensorStore, run: str, policy: Policy, version: int = 0, anchor_every: int = 10):
    """Publish `policy` as the first version of `run`'s chain (an anchor); returns the ChainPublisher
    to publish later versions with (`publisher.publish(v, policy.weights())`)."""
    chain = StoreChain(store, run, policy_config=policy.spec(), anchor_every=anchor_every)
    publisher = ChainPublisher(chain, ChainConfig(anchor_every=anchor_every))
    publisher.publish(version, policy.weights())
    return publisher
