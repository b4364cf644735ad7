"""The trainer's checkpoint in the tensor store: FP32 master weights plus AdamW state, per weights version.

Every pipeline step may run in a fresh process (a Dagster step, a resumed `spotlight
run`), so the trainer's state between iterations lives in the store at
`weights_key(run, v)`: the policy's FP32 `state_dict`, the optimizer's per-parameter
tensors as `opt.{index}.{name}`, and everything else (policy architecture, optimizer
param groups, scalar state) as JSON manifest metadata. Safetensors and JSON only: a
checkpoint never goes through pickle.

Example:
    save_checkpoint(store, "demo", 0, policy)                     # the base, no optimizer yet
    policy, opt_state = load_checkpoint(store, "demo", 3)
    trainer = GRPOTrainer(policy, config); restore_optimizer(trainer.optimizer, opt_state)
    save_checkpoint(store, "demo", 4, policy, trainer.optimizer)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from resources.keys import weights_key
from resources.store.base import TensorStore
from workers.model.policy_loader import build_from_spec
from workers.model.tiny_policy import Policy
from workers.trainer.optimizer_state import SHARDED_FORMAT, state_dict_from
from workers.trainer.sharded_optimizer import load_whole

FORMAT = "spotlight-trainer-checkpoint/1"


@dataclasses.dataclass
class OptimizerState:
    """An optimizer state dict split into tensors and JSON-safe values; or, for a checkpoint an FSDP2 trainer saved
    sharded (workers/trainer/sharded_optimizer.py), no tensors here and `store` where the shards are."""

    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    store: TensorStore | None = None
    """The store holding a sharded state's shards (None for a whole state)."""

    @property
    def sharded(self) -> bool:
        return self.meta.get("format") == SHARDED_FORMAT

    def whole_tensors(self) -> dict[str, torch.Tensor]:
        """The state's tensors whole (`opt.{index}.{name}`): read from the shards when the state is sharded."""
        if not self.sharded:
            return self.tensors
        return load_whole(self.store, self.meta)

    def to_state_dict(self) -> dict[str, Any]:
        return state_dict_from(self.whole_tensors(), self.meta)


def optimizer_state(store: TensorStore, meta: dict, tensors: dict[str, torch.Tensor]) -> OptimizerState | None:
    """A loaded checkpoint's optimizer state (None for the base, which has none)."""
    if meta.get("optimizer") is None:
        return None
    return OptimizerState({k: v for k, v in tensors.items() if k.startswith("opt.")}, meta["optimizer"], store)


def split_optimizer(state_dict: dict[str, Any]) -> OptimizerState:
    """Tensors and JSON parts of an optimizer's `state_dict()` (AdamW: exp_avg, exp_avg_sq, step)."""
    tensors, scalars = {}, {}
    for index, values in state_dict["state"].items():
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"opt.{index}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(index), {})[name] = value
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state_dict["param_groups"]]
    return OptimizerState(tensors, {"scalars": scalars, "param_groups": groups})


def save_checkpoint(
    store: TensorStore, run: str, version: int, policy: Policy, optimizer: torch.optim.Optimizer | None = None
) -> int:
    """Publish the trainer's state after update `version`; returns the bytes written."""
    return publish_checkpoint(
        store, run, version, policy.spec(), policy.weights(), None if optimizer is None else optimizer.state_dict()
    )


def publish_checkpoint(
    store: TensorStore,
    run: str,
    version: int,
    spec: dict,
    weights: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any] | None,
    ema: dict[str, torch.Tensor] | None = None,
) -> int:
    """Publish a checkpoint from its parts: the policy's spec and whole `weights()` (an FSDP trainer gathers them:
    workers/trainer/fsdp.py), and an optimizer `state_dict()` with whole tensors or the metadata of a state its
    ranks saved sharded already (`sharded_optimizer.save_sharded`), and with train.ema the EMA of the weights
    (`ema.<name>` tensors: workers/trainer/ema_weights.py). Returns the bytes this call wrote."""
    tensors = {f"policy.{k}": v.detach().cpu().contiguous() for k, v in weights.items()}
    meta: dict[str, Any] = {"format": FORMAT, "version": version, "policy_config": _plain(spec), "optimizer": None}
    if optimizer_state is not None and optimizer_state.get("format") == SHARDED_FORMAT:
        meta["optimizer"] = optimizer_state
    elif optimizer_state is not None:
        opt = split_optimizer(optimizer_state)
        tensors.update(opt.tensors)
        meta["optimizer"] = opt.meta
    if ema is not None:
        tensors.update({f"ema.{k}": v.detach().cpu().contiguous() for k, v in ema.items()})
        meta["ema"] = True
    result = store.publish_tensors(weights_key(run, version), tensors, meta)
    return sum(e.size_bytes for e in result.manifest.objects.values())


def checkpoint_metadata(store: TensorStore, run: str, version: int) -> dict:
    """The manifest metadata of the trainer checkpoint at `version`; LookupError when there is none, ValueError for
    another format."""
    key = weights_key(run, version)
    manifest = store.read_manifest(key)
    if manifest is None:
        raise LookupError(
            f"run {run!r} has no trainer checkpoint at version {version} ({store.url}/{key}): "
            f"materialize the previous iteration's policy_update first"
        )
    meta = manifest.metadata
    if meta.get("format") != FORMAT:
        raise ValueError(f"{key}: format {meta.get('format')!r}, expected {FORMAT!r}")
    return meta


def load_checkpoint(
    store: TensorStore, run: str, version: int, device: str = "cpu"
) -> tuple[Policy, OptimizerState | None]:
    """The policy at `version` (FP32, eval mode, on `device`) and its optimizer state (None for the base;
    `restore_optimizer` moves it to the parameters' device)."""
    key = weights_key(run, version)
    meta = checkpoint_metadata(store, run, version)
    tensors = store.load_tensors(key)
    policy = build_from_spec(meta["policy_config"])
    policy.load_weights({k[len("policy.") :]: v for k, v in tensors.items() if k.startswith("policy.")})
    return policy.to(device).eval(), optimizer_state(store, meta, tensors)


def restore_optimizer(optimizer: torch.optim.Optimizer, state: OptimizerState | None) -> None:
    """Load a saved optimizer state (no-op for the base checkpoint, which has none)."""
    if state is not None:
        optimizer.load_state_dict(state.to_state_dict())


def bf16_weights(policy: Policy) -> dict[str, torch.Tensor]:
    """The BF16 weights a PULSE chain carries (the forward pass's view of the FP32 masters)."""
    return {k: v.detach().to(torch.bfloat16).cpu() for k, v in policy.weights().items()}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
