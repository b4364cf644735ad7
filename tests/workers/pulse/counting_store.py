"""A local tensor store that counts the committed objects read per commit key (what a receiver downloads)."""

from __future__ import annotations

from collections import Counter

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

    def chain_reads(self) -> dict[str, int]:
        """Reads of anchors and patches only."""
        return {key: n for key, n in self.reads.items() if "/anchors/" in key or "/patches/" in key}
