"""An optimizer `state_dict()` as checkpoints keep it: tensors keyed `opt.{index}.{name}`, the rest as JSON.

Example:
    state_dict = state_dict_from({"opt.0.exp_avg": m, "opt.0.exp_avg_sq": v, "opt.0.step": step}, meta)
"""

from __future__ import annotations

from typing import Any

import torch

SHARDED_FORMAT = "torch.distributed.checkpoint"
"""The optimizer metadata's format of a state saved sharded (workers/trainer/sharded_optimizer.py)."""


def state_dict_from(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    """An optimizer `state_dict()` from `opt.{index}.{name}` tensors and the saved param groups and scalars."""
    state: dict[int, dict[str, Any]] = {}
    for key, tensor in tensors.items():
        _, index, name = key.split(".", 2)
        state.setdefault(int(index), {})[name] = tensor
    for index, values in meta["scalars"].items():
        state.setdefault(int(index), {}).update(values)
    groups = [{**g, "betas": tuple(g["betas"])} if "betas" in g else dict(g) for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}
