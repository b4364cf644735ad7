"""The sync phase: publish weights version k to the run's PULSE chain and check a receiver reaches it.

What the chain carries is the policy's BF16 `weights()`, or for a LoRA run with sync_mode "merged" (`spotlight
train --sync-mode merged`) BF16(base + LoRA delta) of every transformer weight: the anchor then records a plain
transformer's spec, so a rollout worker builds one with no adapter and loads the merged weights into it.

Version 0 is the base policy: its trainer checkpoint and a full BF16 anchor. Version k >= 1
is the trainer's checkpoint after update k-1 -> k: a PULSE patch from version k-1 (plus an
anchor every `anchor_every` versions). The receiver at version k-1 is both the base the
patch is encoded against and the receiver that then applies the published patch and checks
that it reaches the hash of the trainer's own BF16 weights. The process keeps that receiver
(BF16 weights reached from the store, never from a checkpoint) from one version to the
next, so a version costs one patch: encode, read back, apply, hash. Only when it holds no
receiver at k-1 of this chain (a fresh coordinator, a failed check, another run) does it
replay the chain from the nearest anchor, as a fresh rollout worker does. An anchored
version also checks the stored anchor's hash (a fresh worker loads that instead).

Example:
    outcome = publish_version(store, "demo", 3, anchor_every=10)
    assert outcome.reproduced                         # receiver hash == trainer hash
    drop_sync_receiver()                              # free its BF16 weights (the next version replays)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from resources.keys import weights_key
from resources.store.base import TensorStore
from resources.store.chain import StoreChain
from workers.model.families.lora import merged_weights
from workers.model.policy_loader import load_any
from workers.model.tiny_policy import SHIPPED_BASE
from workers.pulse import ChainConfig, ChainPublisher, apply_patch, read_patch_header, sync_weights, weights_hash
from workers.trainer.checkpoint import bf16_weights, save_checkpoint
from workers.trainer.resident import adopt, resident_checkpoint


@dataclass(frozen=True)
class SyncOutcome:
    """What publishing one version cost and whether a receiver reproduces it."""

    version: int
    kind: str
    """anchor (version 0: the whole policy) or patch."""
    dense_bytes: int
    """Size of the full BF16 weights: what a dense sync sends every version."""
    sent_bytes: int
    """Bytes a worker one version behind downloads (the patch, or the anchor for version 0)."""
    changed_fraction: float
    """Share of BF16 values that changed since version-1 (1.0 for the anchor)."""
    encode_s: float
    """Seconds to diff version-1 against version and encode and publish the patch (anchor: publish it)."""
    apply_s: float
    """Seconds a worker one version behind takes to apply the published patch and check the hash
    (version 0: a fresh worker loading the anchor)."""
    replay_s: float
    """Seconds to reach version-1 as receivers hold it: checking the kept receiver (one manifest read), or
    replaying the chain from the store (anchor + patches + hash check)."""
    trainer_hash: str
    """xxh3-128 of the trainer's BF16 weights at this version."""
    receiver_hash: str
    """xxh3-128 of what the receiver reached."""
    anchored: bool
    """True when an anchor was also stored at this version."""
    receiver: str = "replayed"
    """Where version-1 came from: "kept" (this process's receiver, one patch behind), "replayed" (from the
    nearest anchor) or "none" (version 0)."""

    @property
    def reproduced(self) -> bool:
        return self.trainer_hash == self.receiver_hash


def publish_version(
    store: TensorStore,
    run: str,
    version: int,
    *,
    anchor_every: int = 10,
    base: str | Path | None = None,
    model: dict | None = None,
) -> SyncOutcome:
    """Publish `version` (version 0 from the `base` folder, default the shipped base; a diffusers pipeline folder
    with `model`'s ModelSpec fields, e.g. lora_rank, sync_mode) and verify it."""
    if version == 0:
        policy = load_any(base or SHIPPED_BASE, **(model or {}))
        save_checkpoint(store, run, 0, policy)
        adopt(policy, policy.spec(), store, run, 0)  # the later phases update this object in place
        receiver_spec, current = published_form(policy)
    else:
        receiver_spec, current = checkpoint_form(store, run, version)
    chain = StoreChain(store, run, policy_config=receiver_spec, anchor_every=anchor_every)
    config = ChainConfig(anchor_every=anchor_every)
    previous, replay_s, source = _previous_version(chain, version, config)
    started = time.perf_counter()
    publisher = ChainPublisher(
        chain, config, last_version=None if previous is None else version - 1, last_state=previous
    )
    publisher.publish(version, current)
    encode_s = time.perf_counter() - started
    dense = sum(t.numel() * t.element_size() for t in current.values())
    receiver_hash, apply_s, patch, reached = _receive(chain, version, previous, anchored=version % anchor_every == 0)
    trainer_hash = weights_hash(current)
    _keep_receiver(chain, version, reached if receiver_hash == trainer_hash else None)
    if patch is None:
        sent, changed, kind = dense, 1.0, "anchor"
    else:
        sent, kind = len(patch), "patch"
        changed = read_patch_header(patch).num_changed / sum(t.numel() for t in current.values())
    return SyncOutcome(
        version,
        kind,
        dense,
        sent,
        changed,
        encode_s,
        apply_s,
        replay_s,
        trainer_hash,
        receiver_hash,
        version % anchor_every == 0,
        source,
    )


def published_form(policy) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the spec a receiver builds its policy from, the BF16 weights the chain carries): the policy's own spec and
    `weights()`, or under a LoRA's sync_mode "merged" a plain transformer's spec and the whole transformer with
    the adapter merged into each target weight (`workers.model.families.lora.merged_weights`)."""
    spec = getattr(policy, "model_spec", None)
    if spec is None or spec.sync_mode != "merged":
        return policy.spec(), bf16_weights(policy)

    return spec.receiver().to_json(), merged_weights(policy.transformer)[0]


def checkpoint_form(store: TensorStore, run: str, version: int) -> tuple[dict, dict[str, torch.Tensor]]:
    """`published_form` of checkpoint `version`. Read from the checkpoint's tensors when they are what the chain
    carries (no policy is built); a merged sync needs the transformer to merge into: the resident policy's."""
    meta = store.read_manifest(weights_key(run, version))
    spec = None if meta is None else meta.metadata.get("policy_config", {})
    if spec is None or spec.get("sync_mode") == "merged":
        return published_form(resident_checkpoint(store, run, version)[0])
    tensors = store.load_tensors(weights_key(run, version))
    return spec, {k[len("policy.") :]: v.to(torch.bfloat16) for k, v in tensors.items() if k.startswith("policy.")}


@dataclass
class _Receiver:
    """The BF16 weights receivers hold at `version` of a run's chain, kept in this process between versions."""

    store_url: str
    run: str
    version: int
    fingerprint: str
    """`StoreChain.version_fingerprint(version)` when it was reached."""
    weights: dict[str, torch.Tensor]


_receiver: _Receiver | None = None


def drop_sync_receiver() -> None:
    """Forget the kept receiver and free its weights; the next version replays the chain from its anchor."""
    global _receiver
    _receiver = None


def _previous_version(chain: StoreChain, version: int, config: ChainConfig) -> tuple[dict | None, float, str]:
    """Version-1 as receivers hold it, from the chain (not an old checkpoint), the seconds it took, and where it
    came from: the kept receiver when it holds version-1 of this very chain (checked by its fingerprint), else a
    replay from the nearest anchor. The kept receiver is taken out of the process state while in use, so a
    failure half-way never leaves a receiver that claims a version it no longer holds."""
    global _receiver
    if version == 0:
        return None, 0.0, "none"
    started = time.perf_counter()
    kept, _receiver = _receiver, None
    if (
        kept is not None
        and (kept.store_url, kept.run, kept.version) == (chain.store.url, chain.run, version - 1)
        and chain.version_fingerprint(version - 1) == kept.fingerprint
    ):
        return kept.weights, time.perf_counter() - started, "kept"
    del kept  # freed before the replay: never two receivers at once
    previous: dict = {}
    sync_weights(previous, None, version - 1, chain, config)
    return previous, time.perf_counter() - started, "replayed"


def _keep_receiver(chain: StoreChain, version: int, reached: dict[str, torch.Tensor] | None) -> None:
    """Keep `reached` as the receiver at `version` (None: it failed its check; keep nothing)."""
    global _receiver
    fingerprint = None if reached is None else chain.version_fingerprint(version)
    if fingerprint is not None:
        _receiver = _Receiver(chain.store.url, chain.run, version, fingerprint, reached)


def _receive(
    chain: StoreChain, version: int, previous: dict | None, *, anchored: bool
) -> tuple[str, float, bytes | None, dict[str, torch.Tensor]]:
    """Reach `version` as a receiver would, from what the store now holds: (hash reached, seconds, the patch, the
    weights reached).

    `previous` (version-1) takes the published patch in place; version 0 loads the anchor (into tensors that own
    their memory, so later patches can write them). An anchored version's stored anchor must hash the same, else
    its hash is the one reported.
    """
    started = time.perf_counter()
    if previous is None:
        anchor, patch = chain.get_anchor(version), None
        reached = {name: anchor.pop(name).clone() for name in list(anchor)}
    else:
        patch = chain.get_patch(version)
        apply_patch(previous, patch, base_version=version - 1)
        reached = previous
    receiver_hash = weights_hash(reached)
    apply_s = time.perf_counter() - started
    if anchored and previous is not None:
        anchor_hash = weights_hash(chain.get_anchor(version))
        receiver_hash = receiver_hash if anchor_hash == receiver_hash else anchor_hash
    return receiver_hash, apply_s, patch, reached
