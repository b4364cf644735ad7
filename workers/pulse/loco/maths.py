"""PULSELoCo maths: DiLoCo pseudo-gradients through a BF16-visibility gate with FP32 error feedback.

Pure torch on flat FP32 vectors (every parameter of the model, sorted by name, end to
end; see `flatten`). No transport, store or ledger in here. One round per replica:

    delta = theta_global - theta_local           # the DiLoCo pseudo-gradient
    s     = e + delta                            # plus what earlier rounds held back
    gate  = bf16(theta_global) != bf16(theta_global - s)
    send    s[gate] (FP32 values, sorted flat indices)
    e     = s with the gated entries zeroed      # held back, in FP32, for the next round

then every replica averages the received sparse pseudo-gradients in replica order and
takes the same outer Nesterov step, so all of them end the round with bit-identical
global weights.

Example:
    update, error = gate_pseudo_gradient(global_N, local_N, error_N)
    ... exchange updates ...
    avg_N = average_sparse(received_updates, numel)
    outer_step(global_N, momentum_N, avg_N, OuterConfig())
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

LOCO_MODES = ("ddp", "diloco", "pulseloco")
"""ddp: gradients averaged every step; diloco: dense FP32 pseudo-gradients every round;
pulseloco: gated sparse FP32 pseudo-gradients with error feedback every round."""


@dataclass(frozen=True)
class OuterConfig:
    """DiLoCo's outer optimizer: SGD with Nesterov momentum on the averaged pseudo-gradient."""

    lr: float = 0.7
    """Outer learning rate (DiLoCo and grail: 0.7)."""
    momentum: float = 0.9
    """Outer momentum (DiLoCo and grail: 0.9)."""
    nesterov: bool = True
    """Nesterov momentum (as torch.optim.SGD(nesterov=True))."""

    def __post_init__(self) -> None:
        if not 0 < self.lr <= 2:
            raise ValueError(f"OuterConfig.lr must be in (0, 2], got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"OuterConfig.momentum must be in [0, 1), got {self.momentum}")


@dataclass(frozen=True)
class SparseUpdate:
    """The part of one replica's pseudo-gradient it sends this round."""

    indices: torch.Tensor
    """(K,) int64, sorted, distinct flat positions."""
    values: torch.Tensor
    """(K,) float32 values of s at those positions."""
    numel: int
    """Length of the flat parameter vector."""

    @property
    def density(self) -> float:
        """Share of entries sent (1 - sparsity)."""
        return self.indices.numel() / max(1, self.numel)


def visibility_gate(global_N: torch.Tensor, s_N: torch.Tensor) -> torch.Tensor:
    """(N,) bool: True where subtracting s would change the BF16 view of the global weights."""
    return global_N.to(torch.bfloat16) != (global_N - s_N).to(torch.bfloat16)


def gate_pseudo_gradient(
    global_N: torch.Tensor, local_N: torch.Tensor, error_N: torch.Tensor
) -> tuple[SparseUpdate, torch.Tensor]:
    """One replica's round: (what to send, the new FP32 error-feedback buffer).

    All inputs are (N,) float32. Every entry of s = error + (global - local) goes either
    to the update or to the returned buffer, never both, so no mass is lost.
    """
    _check_flat(global_N, local_N, error_N)
    s_N = error_N + (global_N - local_N)
    gate_N = visibility_gate(global_N, s_N)
    indices = torch.nonzero(gate_N).squeeze(1)
    update = SparseUpdate(indices, s_N[indices], s_N.numel())
    return update, s_N.masked_fill_(gate_N, 0.0)


def restore_error(update: SparseUpdate, error_N: torch.Tensor) -> torch.Tensor:
    """Error buffer as if nothing had been sent (for a replica the round did not count)."""
    restored = error_N.clone()
    restored[update.indices] = update.values
    return restored


def dense_pseudo_gradient(global_N: torch.Tensor, local_N: torch.Tensor) -> torch.Tensor:
    """DiLoCo: the whole FP32 pseudo-gradient theta_global - theta_local."""
    _check_flat(global_N, local_N)
    return global_N - local_N


def average_sparse(updates: Sequence[SparseUpdate], numel: int) -> torch.Tensor:
    """(numel,) mean of the replicas' sparse updates (absent entries count as zero).

    Summed in the order given, so replicas that receive the same list in the same order
    get bit-identical results.
    """
    if not updates:
        raise ValueError("average_sparse needs at least one update")
    total_N = torch.zeros(numel, dtype=torch.float32)
    for update in updates:
        if update.numel != numel:
            raise ValueError(f"update covers {update.numel} parameters, the model has {numel}")
        total_N[update.indices] += update.values  # indices are distinct within one update
    return total_N.div_(len(updates))


def average_dense(vectors: Sequence[torch.Tensor]) -> torch.Tensor:
    """Mean of dense (N,) vectors, summed in the order given (bit-identical on every replica)."""
    if not vectors:
        raise ValueError("average_dense needs at least one vector")
    total_N = vectors[0].clone()
    for vector in vectors[1:]:
        total_N += vector
    return total_N.div_(len(vectors))


def outer_step(global_N: torch.Tensor, momentum_N: torch.Tensor, avg_N: torch.Tensor, config: OuterConfig) -> None:
    """In place: momentum = mu * momentum + g; theta -= lr * (g + mu * momentum) (Nesterov)."""
    momentum_N.mul_(config.momentum).add_(avg_N)
    # add(alpha=...) as torch.optim.SGD does, so the two give the same bits.
    step_N = avg_N.add(momentum_N, alpha=config.momentum) if config.nesterov else momentum_N
    global_N.sub_(step_N, alpha=config.lr)


def flatten(tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """One FP32 vector of every tensor, in sorted-name order (a fresh copy)."""
    if not tensors:
        raise ValueError("flatten needs at least one tensor")
    return torch.cat([tensors[name].detach().to(torch.float32).reshape(-1) for name in sorted(tensors)])


def unflatten_into(flat_N: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> None:
    """Copy a vector made by `flatten` back into the tensors, in place."""
    offset = 0
    with torch.no_grad():
        for name in sorted(tensors):
            target = tensors[name]
            target.copy_(flat_N[offset : offset + target.numel()].view_as(target))
            offset += target.numel()
    if offset != flat_N.numel():
        raise ValueError(f"vector has {flat_N.numel()} entries, the tensors hold {offset}")


def names_and_shapes(tensors: Mapping[str, torch.Tensor]) -> Iterable[tuple[str, tuple[int, ...]]]:
    """(name, shape) in the order `flatten` lays tensors out."""
    return [(name, tuple(tensors[name].shape)) for name in sorted(tensors)]


def _check_flat(*vectors: torch.Tensor) -> None:
    first = vectors[0]
    for vector in vectors:
        if vector.dtype != torch.float32 or vector.dim() != 1 or vector.shape != first.shape:
            raise ValueError(f"expected (N,) float32 vectors of one length, got {vector.dtype} {tuple(vector.shape)}")
