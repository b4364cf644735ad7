"""Sharded loading for FSDP2 ranks: every rank builds the policy it trains empty (parameters on the meta device: no
`from_pretrained`, no weights read, nothing allocated), and after `fully_shard` allocates only its own shards and
receives them from rank 0 (`set_model_state_dict(..., broadcast_from_rank0=True)`,
torch.distributed.checkpoint.state_dict), which broadcasts its resident policy's weights (the ones it samples with):
no rank loads a second whole copy of the base.

Example (every rank; `distribute(..., from_rank0=True, source=resident)` runs the last two steps per policy):
    policy = empty_policy(store, run, k)
    whole = resident_policy().state_dict() if rank == 0 else None
    shard_policy(policy, mesh); materialise(policy, device, whole)
"""

from __future__ import annotations

import torch
from torch import nn

from resources.store.base import TensorStore
from workers.model.policy_loader import build_from_spec
from workers.trainer.checkpoint import checkpoint_metadata


def empty_policy(store: TensorStore, run: str, version: int):
    """The architecture of checkpoint `version`'s policy with its parameters on the meta device (eval mode)."""
    return build_from_spec(checkpoint_metadata(store, run, version)["policy_config"], empty=True).eval()


def is_empty(policy: nn.Module) -> bool:
    """True for a policy built on the meta device (`empty_policy`): nothing allocated yet."""
    return any(p.is_meta for p in policy.parameters())


def materialise(policy: nn.Module, device: torch.device, whole: dict[str, torch.Tensor] | None) -> None:
    """A collective, after `fully_shard`: this rank's shards of `policy` filled from rank 0's whole state dict.
    `whole`: on rank 0 the weights to broadcast (the policy's own state dict taken before sharding, or the resident
    policy's at the same version), None on the others. A policy built empty allocates its shards first (buffers
    keep the values they were built with)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if is_empty(policy):
        buffers = {name: b.detach().clone() for name, b in policy.named_buffers() if not b.is_meta}
        policy.to_empty(device=device)
        with torch.no_grad():
            for name, b in policy.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(policy, whole or {}, options=options)
