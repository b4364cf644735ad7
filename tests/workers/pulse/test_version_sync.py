"""The sync phase's publish_version: the chain is replayed once per version,
and a receiver reaches the trainer's hash."""

from __future__ import annotations

from collections import Counter

import torch

from resources.keys import anchor_key, patch_key
from resources.store.local import LocalTensorStore


class CountingStore(LocalTensorStore):
    """A local store that counts the committed objects read per commit key."""

    def __init__(self, root) -> None:
        super().__init__(root)
        self.reads: Counter[str] = Counter()

    def load_bytes(self, commit_key: str, name: str) -> bytes:
        self.reads[commit_key] += 1
        return super().load_bytes(commit_key, name)

    def load_tensors(self, commit_key: str, name: str = "tensors.safetensors"):
        # load_tensors reads its object itself (a big one streams through a file), not through load_bytes.
        self.reads[commit_key] += 1
        return super().load_tensors(commit_key, name)


def _train_a_little(policy, version: int) -> None:
    with torch.no_grad():
        for index, param in enumerate(policy.parameters()):
            if index % 2 == version % 2:
                param.add_(0.05 * torch.randn_like(param))


def test_each_version_reads_every_anchor_and_patch_of_its_chain_once(tmp_path, tiny_policy) -> None:
    from workers.coordinator.sync import publish_version
    from workers.model.tiny_policy import save_policy
    from workers.trainer.checkpoint import save_checkpoint

    save_policy(tiny_policy, tmp_path / "tiny")
    store = CountingStore(tmp_path / "store")
    assert publish_version(store, "demo", 0, anchor_every=3, base=tmp_path / "tiny").reproduced
    for version in (1, 2, 3, 4):
        _train_a_little(tiny_policy, version)
        save_checkpoint(store, "demo", version, tiny_policy)
        store.reads.clear()
        outcome = publish_version(store, "demo", version, anchor_every=3)
        assert outcome.reproduced and outcome.kind == "patch"
        chain_reads = {key: n for key, n in store.reads.items() if "/anchors/" in key or "/patches/" in key}
        anchor = (version - 1) - (version - 1) % 3
        expected = {anchor_key("demo", anchor): 1, **{patch_key("demo", v): 1 for v in range(anchor + 1, version + 1)}}
        if version == 3:
            expected[anchor_key("demo", 3)] = 1  # the new anchor is read back once and checked too
        assert chain_reads == expected, version
        assert min(outcome.encode_s, outcome.apply_s, outcome.replay_s) > 0


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
