"""NFT's old policy (v_old) and the KL reference: the frozen policies a trainer runs beside the one it trains.

Full fine-tuning keeps each as a deep copy of the policy, frozen. Under LoRA both are views of the trained policy's
own transformer (`workers.model.families.lora.AdapterView`): v_old is a second adapter holding the weights the
batch was sampled with, the reference is the base with every adapter disabled (a fresh LoRA's B is 0, so the base
is the run's starting policy). The base is then held once, whatever the objective; FSDP shards it once.

Example:
    v_old = frozen_policy(policy, "v_old")        # LoRA: an adapter view; full fine-tuning: a frozen copy
    reference = frozen_policy(policy, None)       # LoRA: the base; full fine-tuning: a frozen copy
    refresh(v_old, policy)                        # v_old := the policy's current weights
"""

from __future__ import annotations

import copy

from workers.model.families.lora import AdapterView

V_OLD_ADAPTER = "v_old"


def frozen_policy(policy, adapter: str | None):
    """A frozen policy beside `policy`: under LoRA the same transformer with adapter `adapter` (None: the base);
    otherwise a deep copy with gradients off (what `adapter` would hold: the policy's current weights)."""
    if getattr(policy, "is_lora", False):
        return AdapterView(policy, adapter)
    return copy.deepcopy(policy).requires_grad_(False)


def refresh(frozen, policy) -> None:
    """`frozen` takes `policy`'s current trained weights (NFT's v_old before each batch is sampled)."""
    if isinstance(frozen, AdapterView):
        frozen.copy_trained()
    else:
        frozen.load_state_dict(policy.state_dict())


def shares_transformer(frozen, policy) -> bool:
    """True for a view of `policy`'s own transformer (nothing of its own to shard or move)."""
    return isinstance(frozen, AdapterView) and frozen.policy is policy
