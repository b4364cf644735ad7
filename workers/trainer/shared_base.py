"""One copy of the base per rank under FSDP2 full fine-tuning: the trained shards gathered back into the resident
policy (the one that samples), not into a second whole copy.

Full fine-tuning under `--nproc N` trains an FSDP2 copy that every rank built empty and filled from rank 0's
resident weights (workers/coordinator/train.py). After the update the whole weights are gathered anyway (rank 0
publishes them); gathering them tensor by tensor into each rank's resident policy leaves every rank holding the
new version in the object that samples it, with no whole copy besides it and no reload from the store.

Example:
    resident = resident_for(trainer.policy)                  # None: this rank samples nothing (queue workers do)
    weights = gather_weights(trainer.policy, resident)       # a collective: every rank, same order
"""

from __future__ import annotations

import torch
from torch import nn

from workers.trainer.resident import resident_policy


def resident_for(trained: nn.Module):
    """This process's resident policy when it has `trained`'s architecture and is not `trained` itself, else None."""
    resident = resident_policy()
    if resident is None or resident is trained or resident.spec() != trained.spec():
        return None
    return resident


def gather_weights(trained: nn.Module, resident: nn.Module | None) -> dict[str, torch.Tensor]:
    """`trained.weights()` whole on the CPU, each tensor gathered from its shards in turn (a collective: every rank
    calls it). With a `resident`, each whole tensor is copied into it and the resident's own tensors are returned:
    the rank then holds one whole copy, the resident's (on a GPU, the returned tensors are CPU copies of it)."""
    target = None if resident is None else resident.weights()
    out = {}
    with torch.no_grad():
        for name, value in trained.weights().items():
            whole = value.full_tensor() if hasattr(value, "full_tensor") else value
            if target is None:
                out[name] = whole.detach().cpu()
                continue
            target[name].copy_(whole)
            del whole
            out[name] = target[name].detach().cpu()
    return out
