"""The sync phase: publish weights version k to the run's PULSE chain and check a receiver reaches it.

Version 0 is the base policy: its trainer checkpoint and a full BF16 anchor. Version k >= 1
is the trainer's checkpoint after update k-1 -> k: a PULSE patch from version k-1 (plus an
anchor every `anchor_every` versions). The check replays what a fresh rollout worker does
(nearest anchor, then patches) and compares the weights hash it reaches with the hash of
the trainer's own BF16 weights.

Example:
    outcome = publish_version(store, "demo", 3, anchor_every=10)
    assert outcome.reproduced                         # receiver hash == trainer hash
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

from resources.store import TensorStore
from resources.store_chain import StoreChain
from workers.pulse import ChainConfig, ChainPublisher, read_patch_header, sync_weights, weights_hash
from workers.trainer.checkpoint import bf16_weights, load_checkpoint, save_checkpoint


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
    apply_s: float
    """A fresh receiver's time to reach the version (anchor + patches + hash check)."""
    trainer_hash: str
    """xxh3-128 of the trainer's BF16 weights at this version."""
    receiver_hash: str
    """xxh3-128 of what the receiver reached."""
    anchored: bool
    """True when an anchor was also stored at this version."""

    @property
    def reproduced(self) -> bool:
        return self.trainer_hash == self.receiver_hash


def publish_version(store: TensorStore, run: str, version: int, *, anchor_every: int = 10,
                    base: str | Path | None = None) -> SyncOutcome:
    """Publish `version` (version 0 from the `base` policy folder, default the shipped base) and verify it."""
    from workers.model.policy import SHIPPED_BASE, load_policy

    started = time.perf_counter()
    if version == 0:
        policy = load_policy(base or SHIPPED_BASE)
        save_checkpoint(store, run, 0, policy)
    else:
        policy, _ = load_checkpoint(store, run, version)
    chain = StoreChain(store, run, policy_config=dataclasses.asdict(policy.config), anchor_every=anchor_every)
    config = ChainConfig(anchor_every=anchor_every)
    previous = None
    if version > 0:  # the previous version as receivers hold it: from the chain, not an old checkpoint
        previous = {}
        sync_weights(previous, None, version - 1, chain, config)
    publisher = ChainPublisher(chain, config, last_version=None if previous is None else version - 1, last_state=previous)
    current = bf16_weights(policy)
    publisher.publish(version, current)
    encode_s = time.perf_counter() - started
    dense = sum(t.numel() * t.element_size() for t in current.values())
    if version == 0:
        sent, changed, kind = dense, 1.0, "anchor"
    else:
        patch = chain.get_patch(version)
        sent, kind = len(patch), "patch"
        changed = read_patch_header(patch).num_changed / sum(t.numel() for t in current.values())
    receiver_hash, apply_s = _fresh_receiver_hash(chain, version, config)
    return SyncOutcome(version, kind, dense, sent, changed, encode_s, apply_s, weights_hash(current), receiver_hash,
                       version % anchor_every == 0)


def _fresh_receiver_hash(chain: StoreChain, version: int, config: ChainConfig) -> tuple[str, float]:
    started = time.perf_counter()
    weights: dict = {}
    sync_weights(weights, None, version, chain, config)
    return weights_hash(weights), time.perf_counter() - started
