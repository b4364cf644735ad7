"""PULSESync: lossless sparse BF16 weight sync (only the values whose BF16 bits changed)."""

from workers.pulse.apply import apply_patch
from workers.pulse.chain import (
    ChainConfig,
    ChainPlan,
    ChainPublisher,
    ChainSink,
    ChainSource,
    MemoryChain,
    plan_chain,
    sync_weights,
)
from workers.pulse.encode import encode_patch
from workers.pulse.patch_format import PatchError, PatchHeader, StreamEntry, TensorEntry, read_patch_header
from workers.pulse.weights_hash import weights_hash

__all__ = [
    "ChainConfig",
    "ChainPlan",
    "ChainPublisher",
    "ChainSink",
    "ChainSource",
    "MemoryChain",
    "PatchError",
    "PatchHeader",
    "StreamEntry",
    "TensorEntry",
    "apply_patch",
    "encode_patch",
    "plan_chain",
    "read_patch_header",
    "sync_weights",
    "weights_hash",
]
