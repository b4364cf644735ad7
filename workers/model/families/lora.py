"""LoRA on a diffusers transformer with peft: the trained adapter, frozen adapters beside it, and the merged weights.

The trained adapter is peft's "default". NFT's old policy (v_old) and the KL reference never train, so under LoRA
they are not copies of the transformer: v_old is a second named adapter on the same base ("v_old", a copy of the
trained one, switched in with peft's `set_adapter`), and the reference is the base itself (every adapter disabled,
peft's `enable_adapters(False)`), as in flow_grpo's and DiffusionNFT's trainers. A 20B base is held once, not three
times; each extra adapter costs what the LoRA does.

The merged form (`merged_weights`) is what a receiver without an adapter runs: BF16(W_base + scale * B @ A) per
target weight, through peft's `get_delta_weight` (bit-identical to diffusers' `fuse_lora`).

Example:
    add_lora(transformer, spec, family.lora_targets)          # "default", B = 0: starts at the base
    v_old = AdapterView(policy, "v_old")                      # adds the adapter, a copy of "default"
    reference = AdapterView(policy, None)                     # the base: adapters disabled
    with torch.no_grad():
        v = v_old.velocity(x, sigma, *v_old.encode_prompts(prompts))
    v_old.copy_trained()                                      # v_old := the trained adapter's current weights
"""

from __future__ import annotations

import copy
import warnings
from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

TRAINED_ADAPTER = "default"
"""peft's name for the adapter the optimizer holds (what checkpoints, PULSE and `save_lora_adapter` carry)."""
LORA_INIT_SEED = 0
"""Seeds lora_A's random init: a run's version 0 is a function of the folder and its ModelSpec alone (before, it
hung on the process's RNG state, so `--nproc 2` and `--nproc 1` started from different adapters)."""


def add_lora(transformer: nn.Module, spec, targets: tuple[str, ...]) -> None:
    """A peft LoRA on `targets` (B = 0 at init, so the policy starts equal to the base, and lora_A drawn from
    LORA_INIT_SEED); only it trains (FP32)."""
    from peft import LoraConfig

    transformer.requires_grad_(False)
    present = {name.rsplit(".", 1)[-1] for name, _ in transformer.named_modules()} | {
        name for name, _ in transformer.named_modules()
    }
    found = [t for t in targets if any(n == t or n.endswith("." + t) for n in present)]
    if not found:
        raise ValueError(f"none of the LoRA target modules {targets} exist in this transformer")
    config = LoraConfig(
        r=spec.lora_rank, lora_alpha=spec.lora_alpha or spec.lora_rank, init_lora_weights=True, target_modules=found
    )
    with torch.random.fork_rng(devices=[]):  # on the CPU, where the folder's transformer loads
        torch.manual_seed(LORA_INIT_SEED)  # peft draws lora_A at random: the same adapter in every process and run
        transformer.add_adapter(config, adapter_name=TRAINED_ADAPTER)
    for name, param in transformer.named_parameters():
        param.requires_grad_(".lora_" in name)
        if ".lora_" in name:
            param.data = param.data.float()


def adapter_of(key: str) -> str | None:
    """The adapter a state-dict key belongs to ("...to_q.lora_A.v_old.weight" -> "v_old"), None for a base weight."""
    if ".lora_" not in key:
        return None
    parts = key.split(".lora_", 1)[1].split(".")
    return parts[1] if len(parts) > 1 else None


def add_adapter_copy(transformer: nn.Module, name: str) -> None:
    """A frozen adapter `name` beside the trained one: the same LoRA config, a copy of its weights (FP32)."""
    from peft.tuners.tuners_utils import set_adapter

    if name in transformer.peft_config:
        raise ValueError(f"the transformer already has an adapter named {name!r}")
    config = copy.deepcopy(transformer.peft_config[TRAINED_ADAPTER])
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():  # peft's random lora_A init: not the run's RNG
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")  # a second adapter is the point
        transformer.add_adapter(config, adapter_name=name)  # diffusers activates the new adapter ...
    set_adapter(transformer, TRAINED_ADAPTER)  # ... so the trained one is made active (and trainable) again
    for key, param in transformer.named_parameters():
        if adapter_of(key) == name:
            param.data = param.data.float()
    copy_adapter(transformer, TRAINED_ADAPTER, name)


def copy_adapter(transformer: nn.Module, source: str, target: str) -> None:
    """Adapter `target`'s weights := adapter `source`'s (peft's adapter state dicts; works on FSDP2 shards)."""
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    with torch.no_grad():
        weights = get_peft_model_state_dict(transformer, adapter_name=source)
        result = set_peft_model_state_dict(transformer, weights, adapter_name=target)
    missing = [k for k in result.missing_keys if adapter_of(k) == target]
    if missing:
        raise RuntimeError(
            f"adapter {target!r} did not take {len(missing)} of {source!r}'s tensors, e.g. {missing[:2]}"
        )


@contextmanager
def adapter_active(transformer: nn.Module, name: str | None) -> Iterator[None]:
    """Run the transformer with adapter `name` (None: no adapter, the base) and every adapter frozen, then with the
    trained adapter again (active and trainable). Wrap forwards only: gradient checkpointing recomputes a block in
    backward with whatever adapter is active then."""
    from peft.tuners.tuners_utils import set_adapter

    if name is None:
        transformer.disable_adapters()
    else:
        set_adapter(transformer, name, inference_mode=True)
    try:
        yield
    finally:
        if name is None:
            transformer.enable_adapters()
        set_adapter(transformer, TRAINED_ADAPTER)


class AdapterView:
    """A frozen policy that is the trained one's transformer run with another adapter: `adapter` (added on first use
    as a copy of the trained one), or None for the base. Everything but the velocity is the policy's own."""

    def __init__(self, policy, adapter: str | None):
        if not getattr(policy, "is_lora", False):
            raise ValueError("an adapter view needs a LoRA policy (lora_rank > 0); full fine-tuning copies the policy")
        if adapter == TRAINED_ADAPTER:
            raise ValueError(f"{TRAINED_ADAPTER!r} is the trained adapter; a frozen view needs another name or None")
        self.policy, self.adapter = policy, adapter
        if adapter is not None and adapter not in policy.transformer.peft_config:
            add_adapter_copy(policy.transformer, adapter)

    def velocity(self, x: torch.Tensor, sigma_N: torch.Tensor, cond, mask=None) -> torch.Tensor:
        with torch.no_grad(), adapter_active(self.policy.transformer, self.adapter):
            return self.policy.velocity(x, sigma_N, cond, mask)

    def copy_trained(self) -> None:
        """Take the trained adapter's current weights (NFT's v_old at sampling time)."""
        if self.adapter is None:
            raise ValueError("the base view has no adapter to copy into")
        copy_adapter(self.policy.transformer, TRAINED_ADAPTER, self.adapter)

    def requires_grad_(self, requires_grad: bool = True) -> "AdapterView":
        """A view is frozen by construction, and its parameters are the trained policy's: they are left alone."""
        if requires_grad:
            raise ValueError("an adapter view never trains; train the policy it views")
        return self

    def __getattr__(self, name: str):  # encode_prompts, sigmas, parameters, device, ...: the policy's
        return getattr(self.policy, name)


def merged_weights(transformer: nn.Module) -> tuple[dict[str, torch.Tensor], set[str]]:
    """The transformer as a receiver without the adapter holds it: BF16 weights with the active LoRA merged into
    each target weight (plain module names, no `.base_layer`), and the names of those target weights."""
    from peft.tuners.lora import LoraLayer

    merged, targets = {}, set()
    layers = {name: m for name, m in transformer.named_modules() if isinstance(m, LoraLayer)}
    with torch.no_grad():
        for key, tensor in transformer.state_dict().items():
            if ".lora_" in key:
                continue
            plain = key.replace(".base_layer.", ".")
            owner = key.split(".base_layer.")[0] if ".base_layer." in key else None
            if owner in layers and key.endswith(".base_layer.weight"):
                layer = layers[owner]
                delta = sum(layer.get_delta_weight(a).float() for a in layer.active_adapters)
                tensor = tensor.float() + delta  # FP32 sum, one rounding to BF16: what peft's merge does in FP32
                targets.add(plain)
            merged[plain] = tensor.detach().to(torch.bfloat16).clone()
    return merged, targets
