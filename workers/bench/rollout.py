"""`spotlight bench rollout`: rollout throughput and GRPO update time of the shipped base policy."""

from __future__ import annotations

import platform
import time

import torch

import dataclasses

from workers.model.policy import load_policy
from workers.trainer.presets import cpu_tiny, cpu_tiny_flow_grpo
from workers.algo.sampler import resolve_forward_dtype
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig


def bench_rollout(batch_size: int = 64, num_steps: int = 8, repeats: int = 3, full_sde: bool = False) -> dict:
    """Median seconds of a batch rollout (with reward) and of one GRPO update on it, with the
    cpu_tiny preset's sampler and objective (ODE rollouts, NFT update); full_sde: Flow-GRPO's
    preset with every step sampled by the SDE and trained instead."""
    if batch_size < 8 or batch_size % 8 or repeats < 1:
        raise ValueError("batch_size must be a multiple of 8 (groups of 8) and repeats >= 1")
    policy = load_policy()
    preset = cpu_tiny_flow_grpo() if full_sde else cpu_tiny()
    window = None if full_sde else preset.sampler.sde_window
    sampler = dataclasses.replace(preset.sampler, num_steps=num_steps, sde_window=window)
    config = TrainConfig(prompts_per_iteration=batch_size // 8, group_size=8, sampler=sampler, grpo=preset.grpo)
    trainer = GRPOTrainer(policy, config)
    trainer.collect(0)  # warm-up: first calls allocate and pick kernels
    rollout_s, update_s = [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        batch = trainer.collect(i + 1)
        rollout_s.append(time.perf_counter() - t0)
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
        "forward_dtype": resolve_forward_dtype(sampler.forward_dtype, torch.device("cpu")),
        "rollout_s": round(med_roll, 4),
        "samples_per_s": round(batch_size / med_roll, 2),
        "grpo_update_s": round(med_upd, 4),
        "grpo_samples_per_s": round(batch_size / med_upd, 2),
        "params_M": round(sum(p.numel() for p in policy.parameters()) / 1e6, 3),
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
    }
