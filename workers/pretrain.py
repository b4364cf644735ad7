"""Flow-matching pretraining of the tiny DiT on rendered MiniGenEval scenes (the base model).

Data is made on the fly: a category is drawn uniformly, then a train-split prompt of
that category, then a scene rendered for it. Held-out prompts are never rendered, so
the held-out split tests combinations the base model has not seen.

Example:
    cfg = PretrainConfig(steps=600)
    policy = build_policy(PolicyConfig(), seed=cfg.seed)
    for step, loss in pretrain(policy, cfg): ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from workers.prompts import parse_prompt, split_prompts
from workers.render import render_scene, to_model_space


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = 600
    """Optimizer steps."""
    batch_size: int = 32
    lr: float = 1e-3
    """AdamW peak learning rate (linear warm-up, then constant)."""
    warmup_steps: int = 50
    weight_decay: float = 0.0
    seed: int = 0
    """Fixes the initial weights, the data and the noise."""

    def __post_init__(self):
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"steps and batch_size must be >= 1, got {self.steps}, {self.batch_size}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")


class SceneStream:
    """An endless, seeded stream of (prompts, images in [-1, 1]) from the train split."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        by_cat: dict[str, list[str]] = {}
        for p in split_prompts()["train"]:
            by_cat.setdefault(parse_prompt(p).category, []).append(p)
        self.categories = sorted(by_cat)
        self.by_cat = by_cat

    def batch(self, n: int) -> tuple[list[str], torch.Tensor]:
        prompts = []
        for _ in range(n):
            cat = self.categories[self.rng.integers(len(self.categories))]
            pool = self.by_cat[cat]
            prompts.append(pool[self.rng.integers(len(pool))])
        images = np.stack([render_scene(parse_prompt(p), self.rng) for p in prompts])
        return prompts, to_model_space(images)


def flow_matching_loss(policy, prompts: list[str], x0_N3HW: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """MSE between predicted and true velocity (eps - x0) at logit-normal sigmas (SD3's choice)."""
    n = x0_N3HW.shape[0]
    sigma = torch.sigmoid(torch.randn(n, generator=gen))
    eps = torch.randn(x0_N3HW.shape, generator=gen)
    s = sigma.view(n, 1, 1, 1)
    x = (1 - s) * x0_N3HW + s * eps
    emb, mask = policy.encode_prompts(prompts)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        v = policy.velocity(x, sigma, emb, mask)
    return torch.nn.functional.mse_loss(v.float(), eps - x0_N3HW)


def pretrain(policy, config: PretrainConfig) -> Iterator[tuple[int, float]]:
    """Train in place; yields (step, loss) after every optimizer step."""
    stream = SceneStream(config.seed)
    gen = torch.Generator().manual_seed(config.seed)
    opt = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, config.warmup_steps)))
    policy.train()
    for step in range(1, config.steps + 1):
        prompts, x0 = stream.batch(config.batch_size)
        loss = flow_matching_loss(policy, prompts, x0, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        sched.step()
        yield step, loss.item()
    policy.eval()
