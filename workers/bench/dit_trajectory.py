"""Weight snapshots of the tiny DiT under real GRPO updates, for `spotlight bench pulse`.

Each yielded state is the policy's FP32 master weights after one optimizer step of the
GRPO trainer on MiniGenEval rollouts (the first state is the starting policy). The
benchmark casts them to BF16 as the forward pass does.

Example:
    figures = bench_trajectory(dit_grpo_states(num_states=33, lr=3e-6))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import torch

from workers.model.tiny_policy import SHIPPED_BASE, load_policy
from workers.trainer.grpo_trainer import GRPOTrainer
from workers.trainer.presets import get_preset


def dit_grpo_states(
    num_states: int,
    lr: float,
    checkpoint=SHIPPED_BASE,
    prompts_per_iteration: int = 4,
    group_size: int = 4,
    reward: str = "minigeneval",
) -> Iterator[dict[str, torch.Tensor]]:
    """num_states successive FP32 state dicts: the start, then one per GRPO optimizer step."""
    if num_states < 2:
        raise ValueError(f"num_states must be >= 2, got {num_states}")
    base = get_preset("cpu_tiny")
    config = dataclasses.replace(
        base,
        prompts_per_iteration=prompts_per_iteration,
        group_size=group_size,
        reward=reward,
        # PULSE's regime: a constant learning rate, whatever the preset's warm-up and schedule
        grpo=dataclasses.replace(base.grpo, lr=lr, lr_warmup_steps=0, lr_schedule="constant", num_minibatches=1),
    )
    policy = load_policy(checkpoint)
    trainer = GRPOTrainer(policy, config)
    yield {k: v.detach().clone() for k, v in policy.state_dict().items()}
    for it in range(1, num_states):
        trainer.update(trainer.collect(it))
        yield {k: v.detach().clone() for k, v in policy.state_dict().items()}
