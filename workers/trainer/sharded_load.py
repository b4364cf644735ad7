"""Sharded loading for FSDP2 ranks: rank 0 alone holds the checkpoint's whole weights; the other ranks build the
policy empty (parameters on the meta device: no `from_pretrained`, no weights read, nothing allocated), and after
`fully_shard` every rank allocates only its own shards and receives them from rank 0
(`set_model_state_dict(..., broadcast_from_rank0=True)`, torch.distributed.checkpoint.state_dict). A 20B base so
costs one whole CPU copy on the machine, not one per rank.

Example (every rank; `distribute(..., from_rank0=True)` runs the last two steps for each policy it shards):
    policy = load_checkpoint(store, run, k)[0] if rank == 0 else empty_policy(store, run, k)
    whole = policy.state_dict() if rank == 0 else None
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


def materialise(policy: nn.Module, device: torch.device, whole: dict[str, torch.Tensor] | None) -> None:
    """A collective, after `fully_shard`: this rank's shards of `policy` filled from rank 0's whole state dict.
    `whole`: rank 0's `policy.state_dict()` taken before sharding; None on the ranks that built the policy empty,
    which allocate their shards first (buffers keep the values they were built with)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if whole is None:
        buffers = {name: b.detach().clone() for name, b in policy.named_buffers() if not b.is_meta}
        policy.to_empty(device=device)
        with torch.no_grad():
            for name, b in policy.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(policy, whole or {}, options=options)
