"""`spotlight bench pulse-modes`: PULSE's three ways to sync a LoRA-trained policy, measured side by side on real
trainer updates.

- **lora**: PULSESync patches of the adapter's BF16 tensors (`spotlight train --lora-rank R`'s default); the
  receiver runs the base plus the adapter.
- **merged**: PULSESync patches of the merged transformer, BF16(W_base + scale * B @ A) per LoRA target weight
  (peft's `get_delta_weight`, through `workers.model.families.lora.merged_weights`: what `spotlight train
  --sync-mode merged` ships); the receiver runs a plain transformer with no adapter. Only target weights can
  change, and a change below the base's BF16 spacing is invisible.
- **dense**: the merged transformer's whole BF16 state dict as safetensors, every step (what a sync without
  PULSE sends).

Each step is one GRPO update by the trainer's own code (`GRPOTrainer.collect` then `update`, the cpu_tiny NFT
objective at --lr) on a pipeline folder: by default a Qwen-Image transformer at the real model's widths (3072
wide, 24 heads of 128) with --layers of its 60 blocks, random init. For each mode and step it reports bytes sent,
the share of BF16 values that changed, encode and apply seconds, and whether the receiver's weights hash equals
the trainer's.

Example:
    figures = run_pulse_modes(lora_rank=32, steps=3)            # builds the real-widths folder
    figures["total"]["merged"]["bytes"], figures["per_step"][0]["lora"]["reached_trainer_hash"]
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import torch

from resources.store.tensors import tensors_from_bytes, tensors_to_bytes
from workers.model.families.lora import merged_weights
from workers.pulse import apply_patch, encode_patch, read_patch_header, weights_hash

MODES = ("lora", "merged", "dense")


def bf16(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to(torch.bfloat16).clone() for k, v in tensors.items()}


def changed_share(prev: dict[str, torch.Tensor], cur: dict[str, torch.Tensor], names=None) -> float:
    names = list(cur) if names is None else list(names)
    changed = sum(int((prev[n].view(torch.int16) != cur[n].view(torch.int16)).sum()) for n in names)
    return changed / max(sum(cur[n].numel() for n in names), 1)


def patch_sync(receiver: dict, prev: dict, cur: dict, step: int) -> dict:
    """One PULSESync round prev -> cur; the receiver is brought to cur in place."""
    t0 = time.perf_counter()
    patch = encode_patch(prev, cur, base_version=step - 1, version=step)
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    apply_patch(receiver, patch, base_version=step - 1)
    apply_s = time.perf_counter() - t0
    return {
        "bytes": len(patch),
        "changed_values": read_patch_header(patch).num_changed,
        "encode_s": round(encode_s, 4),
        "apply_s": round(apply_s, 4),
        "reached_trainer_hash": weights_hash(receiver) == weights_hash(cur),
    }


def dense_sync(receiver: dict, cur: dict) -> dict:
    """The whole BF16 state dict, serialised and loaded as a receiver would."""
    t0 = time.perf_counter()
    data = tensors_to_bytes(cur)
    encode_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for name, tensor in tensors_from_bytes(data).items():
        receiver[name].copy_(tensor)
    apply_s = time.perf_counter() - t0
    return {
        "bytes": len(data),
        "encode_s": round(encode_s, 4),
        "apply_s": round(apply_s, 4),
        "reached_trainer_hash": weights_hash(receiver) == weights_hash(cur),
    }


def _trainer(path: Path, lora_rank: int, resolution: int, lr: float, sampler_steps: int):
    from workers.algo.sampler import SamplerConfig
    from workers.model.policy_loader import load_any
    from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig
    from workers.trainer.presets import get_preset

    policy = load_any(path, resolution=resolution, lora_rank=lora_rank, base_dtype="fp32")
    grpo = dataclasses.replace(get_preset("cpu_tiny").grpo, lr=lr)
    config = TrainConfig(
        prompts_per_iteration=1,
        group_size=2,
        reward="jpeg_compressibility",
        grpo=grpo,
        sampler=SamplerConfig(num_steps=sampler_steps, noise_level=0.0),
    )
    return policy, GRPOTrainer(policy, config)


def run_pulse_modes(
    model: str | None = None,
    lora_rank: int = 32,
    steps: int = 3,
    layers: int = 1,
    resolution: int = 64,
    lr: float = 3e-4,
    sampler_steps: int = 2,
    workdir: str | None = None,
) -> dict:
    """Train `steps` LoRA updates and sync each one three ways; per-step and total figures (see the module doc)."""
    if lora_rank < 1 or steps < 1 or layers < 1 or sampler_steps < 1 or not lr > 0:
        raise ValueError("--lora-rank, --steps, --layers and the sampler steps must be >= 1, and --lr > 0")
    if model is None:
        from workers.model.families.tiny import build_tiny_pipeline

        root = Path(workdir or tempfile.mkdtemp(prefix="spotlight-pulse-modes-"))
        path = build_tiny_pipeline("qwen-image", root / f"qwen-real-{layers}", widths="real", num_layers=layers)
        described = f"qwen-image, real widths (3072 wide, 24 heads of 128), {layers} of 60 blocks, random init"
    else:
        path, described = Path(model), str(model)
    policy, trainer = _trainer(path, lora_rank, resolution, lr, sampler_steps)
    sent = {"lora": bf16(policy.weights())}
    sent["merged"], targets = merged_weights(policy.transformer)
    receivers = {"lora": bf16(sent["lora"]), "merged": bf16(sent["merged"]), "dense": bf16(sent["merged"])}
    per_step = []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        stats = trainer.update(trainer.collect(step - 1))
        train_s = time.perf_counter() - t0
        lora_now = bf16(policy.weights())
        merged_now, _ = merged_weights(policy.transformer)
        row = {
            "step": step,
            "train_s": round(train_s, 2),
            "loss": stats.get("loss"),
            "lora": {
                **patch_sync(receivers["lora"], sent["lora"], lora_now, step),
                "changed_fraction": changed_share(sent["lora"], lora_now),
            },
            "merged": {
                **patch_sync(receivers["merged"], sent["merged"], merged_now, step),
                "changed_fraction": changed_share(sent["merged"], merged_now),
                "changed_fraction_of_targets": changed_share(sent["merged"], merged_now, targets),
                "changed_outside_targets": changed_share(sent["merged"], merged_now, set(merged_now) - targets),
            },
            "dense": {
                **dense_sync(receivers["dense"], merged_now),
                "changed_fraction": changed_share(sent["merged"], merged_now),
            },
        }
        per_step.append(row)
        sent = {"lora": lora_now, "merged": merged_now}
    return {
        "model": described,
        "lora_rank": lora_rank,
        "resolution": resolution,
        "lr": lr,
        "steps": steps,
        "num_values": {
            "lora": sum(t.numel() for t in sent["lora"].values()),
            "merged": sum(t.numel() for t in sent["merged"].values()),
            "merged_targets": sum(sent["merged"][n].numel() for n in targets),
        },
        "adapter_dense_bytes": len(tensors_to_bytes(sent["lora"])),
        "per_step": per_step,
        "total": _totals(per_step),
    }


def _totals(per_step: list[dict]) -> dict:
    total = {}
    for mode in MODES:
        rows = [r[mode] for r in per_step]
        total[mode] = {
            "bytes": sum(r["bytes"] for r in rows),
            "encode_s": round(sum(r["encode_s"] for r in rows), 4),
            "apply_s": round(sum(r["apply_s"] for r in rows), 4),
            "mean_changed_fraction": sum(r["changed_fraction"] for r in rows) / len(rows),
            "reached_trainer_hash": all(r["reached_trainer_hash"] for r in rows),
        }
    return total


def report_text(figures: dict) -> str:
    """A small table: one line per mode with totals, then the per-step bytes."""
    lines = [
        f"{figures['model']}; LoRA rank {figures['lora_rank']}, lr {figures['lr']}, {figures['steps']} steps",
        f"{'mode':>8} {'bytes':>14} {'changed':>9} {'encode_s':>9} {'apply_s':>8}  hash",
    ]
    for mode, t in figures["total"].items():
        lines.append(
            f"{mode:>8} {t['bytes']:>14,} {t['mean_changed_fraction']:>9.5f} {t['encode_s']:>9.3f} "
            f"{t['apply_s']:>8.3f}  {'ok' if t['reached_trainer_hash'] else 'MISMATCH'}"
        )
    return "\n".join(lines)
