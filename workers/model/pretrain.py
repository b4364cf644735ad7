"""Flow-matching pretraining of the tiny DiT on rendered MiniGenEval scenes or MiniOCR strings (the base models).

Data is made on the fly. MiniGenEval: a category is drawn uniformly, then a train-split prompt of
that category, then a scene rendered for it. MiniOCR: a prompt of the shipped prompts file's training side, its
string rendered in its style and colour. Held-out prompts are never rendered, so the held-out split tests
combinations (MiniGenEval) or strings (MiniOCR) the base model has not seen.

Example:
    cfg = PretrainConfig(steps=2500)
    policy = build_policy(PolicyConfig(), seed=cfg.seed)
    for step, loss in pretrain(policy, cfg): ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch

from workers.algo.sampler import SamplerConfig, autocast_for
from workers.task import miniocr
from workers.task.prompt_file import PromptSource
from workers.task.prompts import parse_prompt, split_prompts
from workers.task.render import render_scene, to_model_space

TASKS = ("minigeneval", "miniocr")


@dataclass(frozen=True)
class PretrainConfig:
    steps: int = 2500
    """Optimizer steps."""
    batch_size: int = 32
    lr: float = 1e-3
    """AdamW peak learning rate (linear warm-up, then cosine decay to 5 % of it)."""
    warmup_steps: int = 50
    ema_decay: float = 0.995
    """The saved weights are an exponential moving average (smoother samples); 0 disables it."""
    weight_decay: float = 0.0
    seed: int = 0
    """Fixes the initial weights, the data and the noise."""
    task: str = "minigeneval"
    """What the images show: "minigeneval" scenes or "miniocr" strings."""

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.steps < 1 or self.batch_size < 1:
            raise ValueError(f"steps and batch_size must be >= 1, got {self.steps}, {self.batch_size}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1), got {self.ema_decay}")


class SceneStream:
    """An endless, seeded stream of (prompts, images in [-1, 1]) from the train split."""

    def __init__(self, seed: int, image_size: int = 32):
        self.rng = np.random.default_rng(seed)
        self.image_size = image_size
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
        images = np.stack([render_scene(parse_prompt(p), self.rng, self.image_size) for p in prompts])
        return prompts, to_model_space(images)


class TextStream:
    """An endless, seeded stream of (prompts, images in [-1, 1]): MiniOCR's training prompts, their strings drawn."""

    def __init__(self, seed: int, image_size: int = 32):
        self.rng = np.random.default_rng(seed)
        self.image_size = image_size
        source = PromptSource.from_file(miniocr.MINIOCR_PROMPTS, miniocr.HELDOUT_FRACTION)
        self.prompts = source.table().train

    def batch(self, n: int) -> tuple[list[str], torch.Tensor]:
        prompts = [self.prompts[i] for i in self.rng.integers(len(self.prompts), size=n)]
        specs = [miniocr.parse_ocr_prompt(p) for p in prompts]
        images = np.stack([miniocr.render_text(s, self.rng, self.image_size) for s in specs])
        return prompts, to_model_space(images)


def flow_matching_loss(policy, prompts: list[str], x0_N3HW: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """MSE between predicted and true velocity (eps - x0) at logit-normal sigmas (SD3's choice)."""
    n = x0_N3HW.shape[0]
    sigma = torch.sigmoid(torch.randn(n, generator=gen))
    eps = torch.randn(x0_N3HW.shape, generator=gen)
    s = sigma.view(n, 1, 1, 1)
    x = (1 - s) * x0_N3HW + s * eps
    emb, mask = policy.encode_prompts(prompts)
    with autocast_for(SamplerConfig(), x.device):  # bf16 where native, else fp32
        v = policy.velocity(x, sigma, emb, mask)
    return torch.nn.functional.mse_loss(v.float(), eps - x0_N3HW)


def lr_factor(step: int, config: PretrainConfig) -> float:
    """Linear warm-up, then cosine decay to 5 % of the peak at the last step."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def pretrain(
    policy, config: PretrainConfig, save: Callable[[int], None] | None = None, save_every: int = 0
) -> Iterator[tuple[int, float]]:
    """Train in place (ending with the EMA weights); yields (step, loss) after every optimizer step. With
    `save_every`, `save(step)` is called every that many steps while the policy holds what pretraining would end
    with if it stopped there (its EMA weights, in eval mode); the training weights come back after it."""
    if save_every < 0 or (save_every and save is None):
        raise ValueError(f"save_every must be >= 0 and needs a save callback, got {save_every}")
    if policy.config.task != config.task:
        raise ValueError(f"the policy reads {policy.config.task} prompts; pretraining task is {config.task}")
    stream_type = TextStream if config.task == "miniocr" else SceneStream
    stream = stream_type(config.seed, policy.config.image_size)
    gen = torch.Generator().manual_seed(config.seed)
    opt = torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, config))
    params = [p for p in policy.parameters() if p.requires_grad]
    ema = [p.detach().clone() for p in params] if config.ema_decay > 0 else None
    policy.train()
    for step in range(1, config.steps + 1):
        prompts, x0 = stream.batch(config.batch_size)
        loss = flow_matching_loss(policy, prompts, x0, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        sched.step()
        if ema is not None:
            torch._foreach_lerp_(ema, [p.detach() for p in params], 1 - config.ema_decay)
        if save is not None and save_every and step % save_every == 0 and step < config.steps:
            _save_with_ema(policy, params, ema, save, step)
        yield step, loss.item()
    if ema is not None:
        with torch.no_grad():
            for p, e in zip(params, ema, strict=False):
                p.copy_(e)
    policy.eval()


def _save_with_ema(policy, params: list, ema: list | None, save: Callable[[int], None], step: int) -> None:
    """`save(step)` with the EMA weights in `params` (the training weights without an EMA) and the policy in eval mode;
    then the training weights and mode back, so the loop goes on as if nothing happened."""
    with torch.no_grad():
        training = [p.detach().clone() for p in params]
        if ema is not None:
            torch._foreach_copy_(params, ema)
    policy.eval()
    try:
        save(step)
    finally:
        with torch.no_grad():
            torch._foreach_copy_(params, training)
        policy.train()


def evaluate_base(policy, task: str):
    """The base's held-out result: MiniGenEval's detector on its held-out split (64 prompts x 2 seeds, 8-step ODE),
    or the OCR reward on MiniOCR's held-out strings (x 2 seeds, the same sampler)."""
    from workers.task.evaluate import evaluate, evaluate_reward

    if task == "minigeneval":
        return evaluate(policy, split_prompts()["heldout"])
    source = PromptSource.from_file(miniocr.MINIOCR_PROMPTS, miniocr.HELDOUT_FRACTION)
    sampler = SamplerConfig(num_steps=8, noise_level=0.0)
    return evaluate_reward(policy, list(source.table().heldout), "ocr", 2, sampler, batch_size=64, fields=source)
