"""Per-component advantages for a weighted multi-reward: each component normalised within its group, then weighted.

With a weighted sum of rewards, the component with the largest spread within a group sets the advantages and a
component that moves little stalls. Normalising each component within the group first gives every component
the same scale before its weight applies, so a weight says how much a component counts whatever its units or
spread. Pure torch, no I/O; N = samples in the batch.

Example:
    adv_N = component_advantages({"ocr": ocr_N, "pick": pick_N}, {"ocr": 1.0, "pick": 1.0}, group_ids_N)
"""

from __future__ import annotations

import torch

from workers.algo.grpo import normalised_deviations


def component_advantages(
    components: dict[str, torch.Tensor],
    weights: dict[str, float],
    group_ids_N: torch.Tensor,
    clip: float = 5.0,
    eps: float = 1e-4,
    norm: str = "group",
) -> torch.Tensor:
    """sum_c w_c * z_c / sum_c |w_c|, clipped, where z_c is component c's (value - group mean) / (std + eps).

    A component whose values are all equal within a group contributes zero there. With one component of
    positive weight this is exactly `group_advantages` of that component: the weighted mean keeps a single
    normalised advantage's scale, so a preset's learning rate and advantage scale carry over.
    components: name -> (N,) raw values; weights: name -> weight (finite, not all zero); group_ids_N: (N,) int.
    """
    check_component_weights(components, weights)
    total = sum(abs(w) for w in weights.values())
    adv = torch.zeros(len(group_ids_N), dtype=torch.float64)
    for name, weight in weights.items():
        values = torch.as_tensor(components[name], dtype=torch.float64)
        if values.shape != group_ids_N.shape:
            raise ValueError(
                f"component {name!r} has shape {tuple(values.shape)}, group ids {tuple(group_ids_N.shape)}"
            )
        z = normalised_deviations(values, group_ids_N, eps, norm)
        adv += weight * torch.where(_tied_groups(values, group_ids_N), torch.zeros_like(z), z)
    return (adv / total).clamp(-clip, clip).float()


def check_component_weights(components: dict[str, torch.Tensor], weights: dict[str, float]) -> None:
    """ValueError unless every weighted component has values and the weights are finite and not all zero."""
    missing = sorted(set(weights) - set(components))
    if missing:
        raise ValueError(f"per-component advantages: components {missing} have no values (got {sorted(components)})")
    if not weights or not all(abs(w) < float("inf") for w in weights.values()) or not any(weights.values()):
        raise ValueError(f"per-component advantages need finite weights, not all zero; got {weights}")


def _tied_groups(values_N: torch.Tensor, group_ids_N: torch.Tensor) -> torch.Tensor:
    """(N,) bool: the sample's group has one value only (its deviations are rounding, not signal)."""
    _, inv = torch.unique(group_ids_N, return_inverse=True)
    g = int(inv.max()) + 1
    high = torch.full((g,), float("-inf"), dtype=values_N.dtype).scatter_reduce(0, inv, values_N, "amax")
    low = torch.full((g,), float("inf"), dtype=values_N.dtype).scatter_reduce(0, inv, values_N, "amin")
    return (high == low)[inv]
