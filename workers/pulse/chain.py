"""Version chains: a full anchor every K versions plus one patch per version, storage-agnostic.

Example:
    chain = MemoryChain()
    publisher = ChainPublisher(chain, ChainConfig(anchor_every=10))
    for version, state in enumerate(trainer_states):      # sender
        publisher.publish(version, state)
    weights = {}                                          # a fresh receiver
    sync_weights(weights, None, 25, chain)                # anchor 20 + patches 21..25
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from workers.pulse.apply import apply_patch
from workers.pulse.encode import encode_patch
from workers.pulse.patch_format import PatchError, read_patch_header
from workers.pulse.weights_hash import as_bf16, weights_hash


@dataclass(frozen=True)
class ChainConfig:
    """How versions are published and reached."""

    anchor_every: int = 10
    """A full BF16 anchor is stored at every version divisible by this (version 0 included)."""
    max_patches: int = 10
    """A receiver this many versions behind or fewer applies patches; further behind, it loads an anchor."""
    mode: str = "absolute"
    """Patch mode for published patches: absolute or ulp_delta."""
    zstd_level: int = 1
    """zstd level for published patches."""

    def __post_init__(self) -> None:
        if self.anchor_every < 1:
            raise ValueError(f"anchor_every must be >= 1, got {self.anchor_every}")
        if self.max_patches < 0:
            raise ValueError(f"max_patches must be >= 0, got {self.max_patches}")
        if self.mode not in ("absolute", "ulp_delta"):
            raise ValueError(f"mode must be absolute or ulp_delta, got {self.mode!r}")


class ChainSource(Protocol):
    """Where a receiver reads anchors and patches (a tensor store, or memory in tests)."""

    def get_anchor(self, version: int) -> dict[str, torch.Tensor]:
        """Full BF16 weights of an anchor version."""

    def get_patch(self, version: int) -> bytes:
        """The patch from version - 1 to version."""


class ChainSink(Protocol):
    """Where a sender writes anchors and patches."""

    def put_anchor(self, version: int, weights: Mapping[str, torch.Tensor]) -> None: ...

    def put_patch(self, version: int, patch: bytes) -> None: ...


@dataclass
class MemoryChain:
    """In-memory ChainSource and ChainSink (tests, single-process demos)."""

    anchors: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    patches: dict[int, bytes] = field(default_factory=dict)

    def get_anchor(self, version: int) -> dict[str, torch.Tensor]:
        if version not in self.anchors:
            raise KeyError(f"no anchor for version {version}")
        return self.anchors[version]

    def get_patch(self, version: int) -> bytes:
        if version not in self.patches:
            raise KeyError(f"no patch for version {version}")
        return self.patches[version]

    def put_anchor(self, version: int, weights: Mapping[str, torch.Tensor]) -> None:
        self.anchors[version] = {name: tensor.clone() for name, tensor in weights.items()}

    def put_patch(self, version: int, patch: bytes) -> None:
        self.patches[version] = patch


@dataclass
class ChainPublisher:
    """Sender side: one patch per new version, plus an anchor every anchor_every versions.

    To resume a sender, construct it with the version and BF16 weights it last published.
    """

    sink: ChainSink
    config: ChainConfig = field(default_factory=ChainConfig)
    last_version: int | None = None
    last_state: dict[str, torch.Tensor] | None = None

    def publish(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        """Store version `version` (FP32 states are cast to BF16 as the forward pass does)."""
        if self.last_version is None and version % self.config.anchor_every != 0:
            raise ValueError(f"the first published version must be an anchor version, got {version}")
        if self.last_version is not None and version != self.last_version + 1:
            raise ValueError(f"versions must be published in order: {self.last_version} then {version}")
        cur = {name: as_bf16(tensor, name).clone() for name, tensor in state.items()}
        if self.last_state is not None:
            patch = encode_patch(
                self.last_state,
                cur,
                base_version=version - 1,
                version=version,
                mode=self.config.mode,
                level=self.config.zstd_level,
            )
            self.sink.put_patch(version, patch)
        if version % self.config.anchor_every == 0:
            self.sink.put_anchor(version, cur)
        self.last_version, self.last_state = version, cur


@dataclass(frozen=True)
class ChainPlan:
    """How to reach a version: optionally load an anchor, then apply these patches in order."""

    anchor: int | None
    patches: tuple[int, ...]


def plan_chain(current: int | None, target: int, config: ChainConfig) -> ChainPlan:
    """Patches only when the receiver is at most max_patches behind; otherwise the nearest anchor."""
    if target < 0:
        raise ValueError(f"target version must be >= 0, got {target}")
    if current is not None and current <= target and target - current <= config.max_patches:
        return ChainPlan(anchor=None, patches=tuple(range(current + 1, target + 1)))
    anchor = target - target % config.anchor_every
    return ChainPlan(anchor=anchor, patches=tuple(range(anchor + 1, target + 1)))


def sync_weights(
    weights: MutableMapping[str, torch.Tensor],
    current: int | None,
    target: int,
    source: ChainSource,
    config: ChainConfig = ChainConfig(),
    *,
    expected_hash: str | None = None,
) -> ChainPlan:
    """Bring a receiver from version `current` (None: holds nothing valid) to `target`.

    Loads an anchor in place (or fills an empty dict) if the plan needs one, applies
    the patches, then checks the weights hash against the last patch's target hash
    (or `expected_hash`). Raises PatchError on any refusal or a final hash mismatch;
    after a mid-chain refusal the weights sit at the version before the refused patch.
    """
    plan = plan_chain(current, target, config)
    if plan.anchor is not None:
        _load_anchor(weights, source.get_anchor(plan.anchor))
    expected, patch = expected_hash, None
    for version in plan.patches:
        patch = source.get_patch(version)
        try:
            apply_patch(weights, patch, base_version=version - 1)
        except PatchError as err:
            raise PatchError(f"chain to version {target} stopped at version {version - 1}: {err}") from err
    if expected is None and patch is not None:
        expected = read_patch_header(patch).target_hash
    if expected is not None and weights_hash(weights) != expected:
        raise PatchError(f"weights hash after reaching version {target} does not match the sender's")
    return plan


def _load_anchor(weights: MutableMapping[str, torch.Tensor], anchor: Mapping[str, torch.Tensor]) -> None:
    """Copy an anchor into existing tensors (keeping model parameters' storage) or fill an empty dict."""
    if not weights:
        weights.update({name: tensor.clone() for name, tensor in anchor.items()})
        return
    if set(weights) != set(anchor):
        raise PatchError(f"anchor and receiver hold different tensors: {sorted(set(weights) ^ set(anchor))[:5]}")
    for name, tensor in anchor.items():
        if weights[name].shape != tensor.shape or weights[name].dtype != tensor.dtype:
            raise PatchError(f"anchor tensor {name!r} does not match the receiver's shape or dtype")
    with torch.no_grad():
        for name, tensor in anchor.items():
            weights[name].copy_(tensor)
