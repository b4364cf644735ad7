"""The resident policy: one policy object per process, built once and updated in place across phases and iterations.

Every phase of an iteration needs the policy at some weights version: sync (merged sync), the in-process rollout,
train, exploration on the stale weights, validation. Building it means `from_pretrained` of the base transformer
from disk (minutes for a 40 GB one); the versions differ only in the trained weights (a LoRA adapter, or the
transformer's masters). So the process keeps the first policy it builds and, for each later version, copies the
checkpoint's weights into it in place (`policy.load_weights`); a version already in place is not copied again.
A checkpoint of another architecture (another spec) replaces the resident policy.

Under `--nproc N` each rank keeps one resident policy too: under LoRA it is also what trains (the adapters'
gradients summed over the ranks), so a rank holds one base; under full fine-tuning FSDP2 trains shards built empty
and filled from rank 0's resident weights, and the trained weights are gathered back into each rank's resident
policy (workers/trainer/shared_base.py). Not resident: the KL reference of full fine-tuning (a frozen copy, by
design). A resident policy reads the run's prompt embeddings from the store (`attach_prompt_store`).

Example:
    policy, optimizer_state = resident_checkpoint(store, "demo", 3)    # built once, then updated in place
    trainer = GRPOTrainer(policy, config); trainer.update(batch)
    mark_version(store, "demo", 4)              # the policy now holds what checkpoint 4 was published from
    release_memory()                            # between phases: collect cycles, return cached device blocks
"""

from __future__ import annotations

import gc
import json
from dataclasses import dataclass
from typing import Any

import torch

from resources.keys import weights_key
from resources.store.base import TensorStore
from workers.model.families.prompt_store import attach_prompt_store
from workers.model.policy_loader import build_from_spec
from workers.trainer.checkpoint import OptimizerState, checkpoint_metadata, optimizer_state
from workers.trainer.optimizer_state import SHARDED_FORMAT


@dataclass
class _Resident:
    spec_key: str
    policy: Any
    version: tuple[str, str, int] | None
    """(store url, run, version) whose weights the policy holds, or None when unknown (handed to a trainer)."""


_resident: _Resident | None = None


def resident_checkpoint(
    store: TensorStore, run: str, version: int, device: str = "cpu"
) -> tuple[Any, OptimizerState | None]:
    """The policy at `version` (eval mode, on `device`) and its optimizer state, as `load_checkpoint` returns them,
    but on this process's resident policy: built on first use (or when the checkpoint's spec differs), otherwise
    updated in place with the checkpoint's weights."""
    global _resident
    key = weights_key(run, version)
    meta = checkpoint_metadata(store, run, version)
    spec_key = json.dumps(meta["policy_config"], sort_keys=True)
    here = (store.url, run, version)
    fresh = _resident is None or _resident.spec_key != spec_key
    needs_weights = fresh or _resident.version != here
    # A whole optimizer state lives beside the weights; a sharded one (FSDP2 ranks) apart from them, read by each rank.
    whole_optimizer = meta.get("optimizer") is not None and meta["optimizer"].get("format") != SHARDED_FORMAT
    tensors = store.load_tensors(key) if needs_weights or whole_optimizer else {}
    if fresh:
        _resident = None
        release_memory()  # the previous architecture's policy goes before the next one is built
        _resident = _Resident(spec_key, build_from_spec(meta["policy_config"]), None)
        # Every rank and phase reads the run's prompt embeddings from the store (the coordinator encoded them all at
        # the base version, on the device, and dropped the encoders): no process loads text encoders again.
        attach_prompt_store(_resident.policy, store, run)
    policy = _resident.policy
    if needs_weights:
        with torch.no_grad():
            policy.load_weights({k[len("policy.") :]: v for k, v in tensors.items() if k.startswith("policy.")})
        _resident.version = here
    return policy.to(device).eval(), optimizer_state(store, meta, tensors)


def adopt(policy, spec: dict, store: TensorStore, run: str, version: int) -> None:
    """Make `policy` (whose weights are checkpoint `version`'s, e.g. the base just published as version 0) this
    process's resident policy, so no phase builds it again."""
    global _resident
    _resident = _Resident(json.dumps(spec, sort_keys=True), policy, (store.url, run, version))
    attach_prompt_store(policy, store, run)


def mark_version(store: TensorStore, run: str, version: int, policy=None) -> None:
    """The resident policy (when it is `policy`, or any with None) now holds checkpoint `version`'s weights: the
    trainer updated it in place and published exactly these."""
    if _resident is not None and (policy is None or _resident.policy is policy):
        _resident.version = (store.url, run, version)


def forget_version() -> None:
    """The resident policy's weights are about to change outside a checkpoint (a trainer holds it)."""
    if _resident is not None:
        _resident.version = None


def resident_policy():
    """This process's resident policy, or None."""
    return None if _resident is None else _resident.policy


def release_resident() -> None:
    """Drop the resident policy (a process that moves to another model, or a test)."""
    global _resident
    _resident = None
    release_memory()


def release_memory() -> None:
    """Free what a phase left behind: reference cycles (a policy's modules hold some) and, on CUDA, the caching
    allocator's unused blocks, so the next phase starts from what is really held."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
