"""A PULSE version chain kept in the tensor store: anchors and patches under a run's keys.

`StoreChain` is the ChainSource / ChainSink of `workers.pulse` on a `TensorStore`:
anchors are committed tensor dicts at `anchor_key(run, v)`, patches committed byte
objects at `patch_key(run, v)`. Each anchor's manifest also records the chain's
`anchor_every` and the policy's architecture (`policy_config`), so a worker that has
never seen the run can build the model and pick the right anchor from the store alone.

Example:
    chain = StoreChain(store, "demo", policy_config=asdict(policy.config), anchor_every=10)
    publisher = ChainPublisher(chain, ChainConfig(anchor_every=10))     # trainer side
    publisher.publish(0, policy.state_dict())
    weights = {}; sync_weights(weights, None, 0, chain)                 # worker side
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping

from resources.keys import anchor_key, patch_key, run_prefix
from resources.store.base import TensorStore

if TYPE_CHECKING:
    import torch

PATCH_NAME = "patch.pulse"


class StoreChain:
    """Anchors and PULSE patches of one run in a tensor store."""

    def __init__(
        self, store: TensorStore, run: str, *, policy_config: Mapping[str, Any] | None = None, anchor_every: int = 10
    ) -> None:
        run_prefix(run)  # validates the run name
        if anchor_every < 1:
            raise ValueError(f"anchor_every must be >= 1, got {anchor_every}")
        self.store = store
        self.run = run
        self.policy_config = dict(policy_config) if policy_config is not None else None
        self.anchor_every = anchor_every

    def put_anchor(self, version: int, weights: Mapping[str, "torch.Tensor"]) -> None:
        meta = {"version": version, "anchor_every": self.anchor_every}
        if self.policy_config is not None:
            meta["policy_config"] = _plain(self.policy_config)
        self.store.publish_tensors(anchor_key(self.run, version), weights, meta)

    def put_patch(self, version: int, patch: bytes) -> None:
        self.store.publish(patch_key(self.run, version), {PATCH_NAME: patch}, {"version": version})

    def get_anchor(self, version: int) -> dict[str, "torch.Tensor"]:
        return self.store.load_tensors(anchor_key(self.run, version))

    def get_patch(self, version: int) -> bytes:
        return self.store.load_bytes(patch_key(self.run, version), PATCH_NAME)

    def anchor_versions(self) -> list[int]:
        """Versions that have a committed anchor, ascending."""
        prefix = anchor_key(self.run, 0).rsplit("/", 1)[0] + "/"
        return sorted(int(key.rsplit("/v", 1)[1]) for key in self.store.list_commits(prefix))

    def version_fingerprint(self, version: int) -> str | None:
        """What defines `version` in the store, as a short string: the commit key and object checksums of its
        patch (version >= 1), else of its anchor; None when neither is committed. Equal fingerprints name the same
        bytes (objects are content-addressed), so a receiver kept in memory can check it still holds this chain's
        version without reading any tensor."""
        keys = [patch_key(self.run, version)] if version >= 1 else []
        for key in (*keys, anchor_key(self.run, version)):
            manifest = self.store.read_manifest(key)
            if manifest is not None:
                return key + ":" + ",".join(entry.xxh3_128 for _, entry in sorted(manifest.objects.items()))
        return None

    def anchor_metadata(self, version: int) -> dict[str, Any]:
        """Manifest metadata of an anchor (policy_config, anchor_every); LookupError if absent."""
        manifest = self.store.read_manifest(anchor_key(self.run, version))
        if manifest is None:
            raise LookupError(f"run {self.run!r} has no anchor at version {version} in {self.store.url}")
        return dict(manifest.metadata)


def _plain(value: Any) -> Any:
    """Tuples -> lists, so the metadata survives the manifest's JSON round trip."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
