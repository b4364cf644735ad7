"""The sync phase's publish_version: a receiver reaches the trainer's hash at every version, reading one patch
per version while the process keeps its receiver, and replaying from the nearest anchor when it does not."""

from __future__ import annotations

import torch

from resources.keys import anchor_key, patch_key
from resources.store.local import LocalTensorStore
from tests.workers.pulse.counting_store import CountingStore


def _train_a_little(policy, version: int) -> None:
    with torch.no_grad():
        for index, param in enumerate(policy.parameters()):
            if index % 2 == version % 2:
                param.add_(0.05 * torch.randn_like(param))


def _chain_reads(store: CountingStore) -> dict[str, int]:
    return {key: n for key, n in store.reads.items() if "/anchors/" in key or "/patches/" in key}


def _publish_base(tmp_path, policy, store, anchor_every: int) -> None:
    from workers.coordinator.sync import publish_version
    from workers.model.tiny_policy import save_policy

    save_policy(policy, tmp_path / "tiny")
    assert publish_version(store, "demo", 0, anchor_every=anchor_every, base=tmp_path / "tiny").reproduced


def _next_version(store: CountingStore, policy, version: int, anchor_every: int):
    from workers.coordinator.sync import publish_version
    from workers.trainer.checkpoint import save_checkpoint

    _train_a_little(policy, version)
    save_checkpoint(store, "demo", version, policy)
    store.reads.clear()
    return publish_version(store, "demo", version, anchor_every=anchor_every)


def test_a_kept_receiver_reads_only_the_new_patch_at_each_version(tmp_path, tiny_policy) -> None:
    store = CountingStore(tmp_path / "store")
    _publish_base(tmp_path, tiny_policy, store, anchor_every=3)
    for version in (1, 2, 3, 4):
        outcome = _next_version(store, tiny_policy, version, anchor_every=3)
        assert outcome.reproduced and outcome.kind == "patch" and outcome.receiver == "kept"
        expected = {patch_key("demo", version): 1}
        if version == 3:
            expected[anchor_key("demo", 3)] = 1  # the new anchor is read back once and checked too
        assert _chain_reads(store) == expected, version
        assert min(outcome.encode_s, outcome.apply_s, outcome.replay_s) > 0


def test_a_fresh_coordinator_replays_each_version_from_the_nearest_anchor(tmp_path, tiny_policy) -> None:
    from workers.coordinator.sync import drop_sync_receiver

    store = CountingStore(tmp_path / "store")
    _publish_base(tmp_path, tiny_policy, store, anchor_every=3)
    for version in (1, 2, 3, 4):
        drop_sync_receiver()  # what a coordinator process started anew holds
        outcome = _next_version(store, tiny_policy, version, anchor_every=3)
        assert outcome.reproduced and outcome.receiver == "replayed"
        anchor = (version - 1) - (version - 1) % 3
        expected = {anchor_key("demo", anchor): 1, **{patch_key("demo", v): 1 for v in range(anchor + 1, version + 1)}}
        if version == 3:
            expected[anchor_key("demo", 3)] = 1
        assert _chain_reads(store) == expected, version


def test_a_kept_receiver_is_not_trusted_once_the_store_holds_another_patch(tmp_path, tiny_policy) -> None:
    from resources.store.chain import StoreChain
    from workers.pulse import encode_patch

    store = CountingStore(tmp_path / "store")
    _publish_base(tmp_path, tiny_policy, store, anchor_every=10)
    assert _next_version(store, tiny_policy, 1, anchor_every=10).receiver == "kept"
    # Another writer replaces patch 1 with one that changes nothing: version 1 is now the base's weights.
    base = store.load_tensors(anchor_key("demo", 0))
    StoreChain(store, "demo").put_patch(1, encode_patch(base, base, base_version=0, version=1))
    outcome = _next_version(store, tiny_policy, 2, anchor_every=10)
    assert outcome.receiver == "replayed" and _chain_reads(store)[anchor_key("demo", 0)] == 1
    assert outcome.reproduced  # the new patch 2 goes from what the store now says version 1 is


def test_a_damaged_stored_anchor_is_reported_as_not_reproduced(tmp_path, tiny_policy) -> None:
    from workers.coordinator.sync import publish_version
    from workers.model.tiny_policy import save_policy
    from workers.pulse import weights_hash
    from workers.trainer.checkpoint import save_checkpoint

    class SwappingStore(LocalTensorStore):
        """Hands out another version's weights for anchor 2, as a stale or mixed-up store would."""

        def load_tensors(self, commit_key, name="tensors.safetensors"):
            key = anchor_key("demo", 0) if commit_key == anchor_key("demo", 2) else commit_key
            return super().load_tensors(key, name)

    save_policy(tiny_policy, tmp_path / "tiny")
    store = SwappingStore(tmp_path / "store")
    publish_version(store, "demo", 0, anchor_every=2, base=tmp_path / "tiny")
    for version in (1, 2):
        _train_a_little(tiny_policy, version)
        save_checkpoint(store, "demo", version, tiny_policy)
        outcome = publish_version(store, "demo", version, anchor_every=2)
    assert not outcome.reproduced
    assert outcome.receiver_hash == weights_hash(store.load_tensors(anchor_key("demo", 0)))
