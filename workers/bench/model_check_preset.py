"""The part of `spotlight bench model-check` that runs what the GPU presets run: each family preset's own update
(its objective and GRPO settings, its guidance (true CFG or FLUX.1's embedding), gradient checkpointing, LoRA rank,
micro-batches and forward precision) on a pipeline of that family, with its peak memory set beside the memory plan's
prediction for exactly the config that ran (workers/trainer/memory_plan.py).

What is scaled down, so that a check fits minutes: one group of `num_samples` rollouts (micro-batches of at most
the preset's size), 2 sampling steps, the folder given (Qwen-Image at its real width with 1 or 2 blocks; SD3 and
FLUX.1 at toy widths, no real-width builders exist for them). On CUDA the peak is `max_memory_allocated` and the
base is BF16 as the presets run it; on the CPU the peak is the process's RSS above what it held before the update
(FP32 forwards there: the plan is made for FP32 too), and the reward is JPEG compressibility (no model).

Example:
    figures = preset_update(Path("/tmp/qwen-real-1"), "qwen_image_lora", "cuda")
    figures["measured_GB"], figures["planned_GB"]
"""

from __future__ import annotations

from pathlib import Path

import torch

PRESET_FAMILIES = {"qwen_image_lora": "qwen-image", "sd35m_lora": "sd3", "flux1_lora": "flux"}
"""The GPU presets and the family each is for."""


def preset_check_config(preset: str, path: Path, device: str, num_samples: int, resolution: int):
    """The preset's RunConfig on `path`, with only the batch, steps, resolution and reward scaled down (and, on the
    CPU, FP32 forwards and base)."""
    from resources.settings.config import RunConfig
    from workers.trainer.presets import preset_config

    tree = preset_config(preset).model_dump()
    cuda = device.startswith("cuda")
    tree["model"].update(model=str(path), resolution=resolution, **({} if cuda else {"base_dtype": "fp32"}))
    micro = tree["train"]["micro_batch"]
    tree["train"].update(
        prompts_per_iteration=1,
        group_size=num_samples,
        minibatches=1,
        micro_batch=None if micro is None else min(micro, max(1, num_samples // 2)),
        reward="jpeg_compressibility",
        device=device,
    )
    tree["sampling"].update(num_steps=2, sde_window=None, rollout_batch=num_samples)
    if tree["sampling"].get("sde_window_size") is not None:  # a random window (qwen_image_lora's): within the 2 steps
        tree["sampling"].update(sde_window_size=min(tree["sampling"]["sde_window_size"], 2), sde_window_range=(0, 2))
    if not cuda:
        tree["sampling"]["forward_dtype"] = "fp32"
    return RunConfig.model_validate(tree)


def preset_update(path: Path, preset: str, device: str, num_samples: int = 4, resolution: int = 256) -> dict:
    """One rollout and one update of `preset` on the folder; the measured peak and the plan's."""
    from workers.bench.memory import peak_rss_bytes, rss_bytes
    from workers.bench.memory_calibrate import reset_peak_rss
    from workers.model.policy_loader import load_any
    from workers.trainer.from_config import model_spec_fields, train_config
    from workers.trainer.grpo_trainer import GRPOTrainer
    from workers.trainer.memory import enable_gradient_checkpointing
    from workers.trainer.memory_plan import plan_memory
    from workers.trainer.model_sizes import model_sizes

    config = preset_check_config(preset, path, device, num_samples, resolution)
    train = train_config(config)
    policy = load_any(path, **model_spec_fields(config)).to(device)
    if config.train.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
    trainer = GRPOTrainer(policy, train)
    batch = trainer.collect(0)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    else:
        reset_peak_rss()
    before = torch.cuda.memory_allocated() if cuda else rss_bytes()
    stats = trainer.update(batch, recompute_old_log_probs=True)
    peak = torch.cuda.max_memory_allocated() if cuda else peak_rss_bytes()
    plan = plan_memory(config, model_sizes(path, config.model.lora_rank), gpu_GB=None)
    # what the update adds to what sampling held: activations, gradients, AdamW state (and an EMA)
    predicted = sum(plan.components[k] for k in plan.phases["update"] if k not in plan.phases["sample"])
    measured = ((peak - before) if not cuda else peak) / 1e9
    planned = plan.phase_GB("update") if cuda else predicted
    return {
        "preset": preset,
        "objective": config.train.objective,
        "guidance": config.model.guidance,
        "gradient_checkpointing": config.train.gradient_checkpointing,
        "micro_batch": config.train.micro_batch,
        "forward_dtype": config.sampling.forward_dtype,
        "lora_rank": config.model.lora_rank,
        "optimizer_steps": stats["optimizer_steps"],
        "grad_norm": stats.get("grad_norm"),
        "measured_GB": round(measured, 3),
        "planned_GB": round(planned, 3),
        "what": "device peak vs the plan's update phase"
        if cuda
        else "RSS above the pre-update level vs the plan's activations + gradients + AdamW (weights were already held)",
    }


def preset_checks(folders: dict[str, Path], device: str, num_samples: int = 4, resolution: int = 256) -> list[dict]:
    """`preset_update` of every GPU preset whose family has a folder in `folders` (family -> folder)."""
    return [
        preset_update(folders[family], preset, device, num_samples, resolution)
        for preset, family in PRESET_FAMILIES.items()
        if family in folders
    ]
