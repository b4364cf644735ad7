"""An exponential moving average of the trained weights, as flow_grpo keeps it (flow_grpo/ema.py,
`EMAModuleWrapper`; scripts/train_sd3.py builds it with decay 0.9 and update_step_interval 8 over the transformer's
trainable parameters, evaluates and saves checkpoints with the EMA weights, and samples rollouts with the live ones).

After optimizer step k (k counts the steps done, this one included), when (k + 1) is a multiple of `every`:
    d = min((1 + k) / (10 + k), decay)          # `get_current_decay`: a short memory while few steps are done
    ema <- ema + (1 - d) * (weights - ema)       # `step`, in place, in FP32
flow_grpo calls `step` after every training micro-batch with its optimizer-step counter, so with gradient
accumulation it applies the update at such a k once per micro-batch; here it is applied once per optimizer step.

Example:
    ema = {name: w.detach().float().clone() for name, w in weights.items()}
    updated = ema_update(ema, weights, optimizer_steps_done, EMAConfig(decay=0.9, every=8))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EMAConfig:
    decay: float = 0.9
    """The longest memory: the decay once (1 + k) / (10 + k) exceeds it (flow_grpo's train_sd3.py: 0.9)."""
    every: int = 8
    """Optimizer steps between updates (flow_grpo's update_step_interval: 8)."""

    def __post_init__(self):
        if not 0 <= self.decay < 1:
            raise ValueError(f"ema decay must be in [0, 1), got {self.decay}")
        if self.every < 1:
            raise ValueError(f"ema every must be >= 1 (optimizer steps between updates), got {self.every}")


def ema_decay(step: int, decay: float) -> float:
    """flow_grpo's `get_current_decay`: min((1 + step) / (10 + step), decay)."""
    return min((1 + step) / (10 + step), decay)


def ema_due(step: int, config: EMAConfig) -> bool:
    """Whether optimizer step `step` updates the EMA: (step + 1) is a multiple of `every`."""
    return (step + 1) % config.every == 0


@torch.no_grad()
def ema_update(ema: dict[str, torch.Tensor], weights: dict[str, torch.Tensor], step: int, config: EMAConfig) -> bool:
    """Move `ema` towards `weights` after optimizer step `step` when the interval says so; True when it did.
    ema: name -> FP32 tensor, the same names as weights (ValueError otherwise)."""
    if set(ema) != set(weights):
        missing, extra = sorted(set(weights) - set(ema))[:3], sorted(set(ema) - set(weights))[:3]
        raise ValueError(f"EMA weights do not match the policy's (missing {missing}, unexpected {extra})")
    if not ema_due(step, config):
        return False
    rate = 1.0 - ema_decay(step, config.decay)
    for name, average in ema.items():
        average.add_(rate * (weights[name].detach().to(average.device, torch.float32) - average))
    return True
