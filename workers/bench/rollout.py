"""`spotlight bench rollout`: rollout throughput and GRPO update time of the shipped base policy, or of a diffusers
pipeline folder (`--model DIR`), and the share of rollout time spent outside the transformer's forward."""

from __future__ import annotations

import dataclasses
import platform
import time

import torch

from workers.algo.sampler import resolve_forward_dtype
from workers.model.policy_loader import load_any
from workers.model.tiny_policy import load_policy
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig, trainable_parameters
from workers.trainer.presets import get_preset


class _ForwardClock:
    """Seconds spent inside the policy's velocity (the transformer's forward, CFG included), synchronised on CUDA."""

    def __init__(self, policy):
        self.seconds, self._velocity = 0.0, policy.velocity
        policy.velocity = self

    def __call__(self, *args, **kwargs):
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        t0 = time.perf_counter()
        out = self._velocity(*args, **kwargs)
        sync()
        self.seconds += time.perf_counter() - t0
        return out


def bench_rollout(
    batch_size: int = 64,
    num_steps: int = 8,
    repeats: int = 3,
    full_sde: bool = False,
    model: str | None = None,
    model_fields: dict | None = None,
    reward: str | None = None,
    device: str = "cpu",
) -> dict:
    """Median seconds of a batch rollout (with reward) and of one GRPO update on it, with the
    cpu_tiny preset's sampler and objective (ODE rollouts, NFT update); full_sde: Flow-GRPO's
    preset with every step sampled by the SDE and trained instead. model: a diffusers pipeline
    folder (with ModelSpec fields such as lora_rank and resolution) instead of the shipped base."""
    if batch_size < 8 or batch_size % 8 or repeats < 1:
        raise ValueError("batch_size must be a multiple of 8 (groups of 8) and repeats >= 1")
    policy = (load_policy() if model is None else load_any(model, **(model_fields or {}))).to(device)
    preset = get_preset("cpu_tiny_flow_grpo") if full_sde else get_preset("cpu_tiny")
    window = None if full_sde else preset.sampler.sde_window
    sampler = dataclasses.replace(preset.sampler, num_steps=num_steps, sde_window=window)
    config = TrainConfig(
        prompts_per_iteration=batch_size // 8,
        group_size=8,
        sampler=sampler,
        grpo=preset.grpo,
        reward=reward or preset.reward,
    )
    trainer = GRPOTrainer(policy, config)
    trainer.collect(0)  # warm-up: first calls allocate and pick kernels
    rollout_s, update_s, forward_share = [], [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        clock = _ForwardClock(policy)
        try:
            batch = trainer.collect(i + 1)
        finally:
            del policy.velocity
        rollout_s.append(time.perf_counter() - t0)
        forward_share.append(clock.seconds / rollout_s[-1])
        t0 = time.perf_counter()
        trainer.update(batch)
        update_s.append(time.perf_counter() - t0)
    med_roll = sorted(rollout_s)[len(rollout_s) // 2]
    med_upd = sorted(update_s)[len(update_s) // 2]
    return {
        "batch_size": batch_size,
        "num_steps": num_steps,
        "objective": preset.grpo.objective,
        "sde_steps": len(sampler.sde_steps),
        "forward_dtype": resolve_forward_dtype(sampler.forward_dtype, torch.device(device)),
        "rollout_s": round(med_roll, 4),
        "samples_per_s": round(batch_size / med_roll, 2),
        "grpo_update_s": round(med_upd, 4),
        "grpo_samples_per_s": round(batch_size / med_upd, 2),
        "off_device_share": round(1 - sorted(forward_share)[len(forward_share) // 2], 4),
        "model": "shipped base" if model is None else f"{policy.model_spec.family} {model}",
        "trainable_params_M": round(sum(p.numel() for p in trainable_parameters(policy)) / 1e6, 3),
        "device": str(device),
        "params_M": round(sum(p.numel() for p in policy.parameters()) / 1e6, 3),
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }
