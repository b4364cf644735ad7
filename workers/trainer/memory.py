"""Trading compute for memory in the update: activation (gradient) checkpointing of the transformer's blocks.

BF16 autocast is the sampler's `forward_dtype` ("auto" = bf16 on CUDA): every trainer forward runs under it
(`workers.algo.sampler.autocast_for`), over FP32 masters or an FP32 LoRA on a BF16 base. Checkpointing keeps
each block's input only and recomputes the block in backward: activation memory falls from one set per block
to one block's worth, for about one more forward. Gradients are unchanged (tests/workers/trainer/test_fsdp.py).
It composes with FSDP2 (workers/trainer/fsdp.py): the recomputed forward runs while the block is gathered.

Example:
    enable_gradient_checkpointing(policy)        # before or after shard_policy
    stats = GRPOTrainer(policy, config).update(batch)
"""

from __future__ import annotations

from torch import nn


def enable_gradient_checkpointing(policy: nn.Module) -> None:
    """Recompute each transformer block in backward (diffusers' non-reentrant torch.utils.checkpoint), for the
    diffusers families and the pixel policy alike; sampling (no grad) is unaffected."""
    transformer = getattr(policy, "transformer", None)
    if transformer is None or not getattr(transformer, "_supports_gradient_checkpointing", False):
        name = type(transformer).__name__ if transformer is not None else type(policy).__name__
        raise ValueError(
            f"{name} does not support gradient checkpointing (needs a diffusers transformer "
            "with _supports_gradient_checkpointing)"
        )
    transformer.enable_gradient_checkpointing()


def gradient_checkpointing_enabled(policy: nn.Module) -> bool:
    transformer = getattr(policy, "transformer", None)
    return bool(getattr(transformer, "gradient_checkpointing", False))
