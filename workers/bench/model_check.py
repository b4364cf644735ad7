"""`spotlight bench model-check`: the prepared GPU check (docs/MODELS.md).

It builds a Qwen-Image-shaped pipeline: the real transformer's widths (3072 wide, 24 heads of 128)
with 1 and then 2 of its 60 blocks, random init, the real VAE's shape (16 latent channels), saved
and loaded back as a user's folder is. At the given resolution it runs one LoRA iteration and one
full fine-tuning iteration (rollout of a batch, reward, NFT update) and reports samples/s, update
seconds, the share of rollout time outside the transformer's forward, peak device memory, the
peak's growth per transformer block (2 blocks minus 1: what the 60-block model adds per block), and
PULSE encode/apply GB/s on the trained weights, and how far the first minibatch's PPO ratio is from 1 before any
step (BF16 forwards, true CFG; `first_ratio_dev`). workers/bench/model_check_memory.py adds the peak fitted against
blocks and batch and extrapolated to 60 blocks plus the text encoder (`memory_fit`), the chunked VAE decode's peak
(`vae_decode`), one FSDP2 update with checkpointing and adapter swaps (`fsdp_update`), and load times with and
without `low_cpu_mem_usage` (`load`). workers/bench/model_check_preset.py runs each GPU preset's own update (its
objective, CFG, checkpointing, micro-batches, precision) and sets its peak beside the memory plan's (`presets`).
`--widths tiny` runs the same path at toy size on a CPU (what the tests do).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import torch

from workers.bench.model_check_memory import fit_memory, fsdp_update, load_times, vae_decode_peak
from workers.bench.model_check_preset import preset_checks
from workers.bench.rollout import bench_rollout
from workers.trainer.presets_recipes import GPU_ROLLOUT_BATCH


def _peak_bytes(device: str) -> int | None:
    return torch.cuda.max_memory_allocated() if device.startswith("cuda") else None


def _one(path: Path, device: str, resolution: int, lora_rank: int, batch_size: int, num_steps: int) -> dict:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    fields = {
        "resolution": resolution,
        "lora_rank": lora_rank,
        "base_dtype": "bf16" if device.startswith("cuda") else "fp32",
    }
    figures = bench_rollout(
        batch_size=batch_size,
        num_steps=num_steps,
        repeats=1,
        model=str(path),
        model_fields=fields,
        reward="jpeg_compressibility",
        device=device,
    )
    figures["peak_memory_GB"] = None if _peak_bytes(device) is None else round(_peak_bytes(device) / 1e9, 3)
    return figures


def pulse_throughput(weights_before: dict, weights_after: dict) -> dict:
    """PULSESync encode and apply GB/s (dense BF16 bytes per second) between two versions of the weights."""
    from workers.pulse.apply import apply_patch
    from workers.pulse.encode import encode_patch

    prev = {k: v.detach().to(torch.bfloat16) for k, v in weights_before.items()}
    cur = {k: v.detach().to(torch.bfloat16) for k, v in weights_after.items()}
    dense = sum(t.numel() * 2 for t in cur.values())
    t0 = time.perf_counter()
    patch = encode_patch(prev, cur, base_version=0, version=1)
    encode_s = time.perf_counter() - t0
    receiver = {k: v.clone() for k, v in prev.items()}
    t0 = time.perf_counter()
    apply_patch(receiver, patch, base_version=0)
    apply_s = time.perf_counter() - t0
    exact = all(torch.equal(receiver[k], cur[k]) for k in cur)
    return {
        "dense_GB": round(dense / 1e9, 4),
        "patch_MB": round(len(patch) / 1e6, 3),
        "encode_GBps": round(dense / 1e9 / encode_s, 3),
        "apply_GBps": round(dense / 1e9 / apply_s, 3),
        "lossless": exact,
    }


def _pulse_after_update(path: Path, resolution: int, lora_rank: int, device: str) -> dict:
    """Weights before and after one optimizer step on a real gradient, through PULSE."""
    from workers.algo.sampler import SamplerConfig
    from workers.model.policy_loader import load_any
    from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig
    from workers.trainer.presets import get_preset

    policy = load_any(
        path, resolution=resolution, lora_rank=lora_rank, base_dtype="bf16" if device.startswith("cuda") else "fp32"
    ).to(device)
    preset = get_preset("cpu_tiny")
    config = TrainConfig(
        prompts_per_iteration=1,
        group_size=8,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=4, noise_level=0.0),
        grpo=preset.grpo,
    )
    trainer = GRPOTrainer(policy, config)
    before = {k: v.detach().clone() for k, v in policy.weights().items()}
    trainer.update(trainer.collect(0))
    return pulse_throughput(before, policy.weights())


def _first_ratio(path: Path, resolution: int, lora_rank: int, device: str) -> dict:
    """max |ratio - 1| of the first minibatch before any step (workers/trainer/old_log_probs.py): Flow-GRPO with true
    CFG 4, 4 SDE steps, 2 minibatches; against the rollout's log-probs and the recomputed ones."""
    from workers.algo.sampler import SamplerConfig
    from workers.model.policy_loader import load_any
    from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig
    from workers.trainer.old_log_probs import first_minibatch_ratio
    from workers.trainer.presets import get_preset

    policy = load_any(
        path,
        resolution=resolution,
        lora_rank=lora_rank,
        guidance=4.0,
        base_dtype="bf16" if device.startswith("cuda") else "fp32",
    ).to(device)
    config = TrainConfig(
        prompts_per_iteration=1,
        group_size=8,
        reward="jpeg_compressibility",
        # BF16 as on GPUs; "auto" on a CPU (emulated BF16 is slow there; the tests cover it)
        sampler=SamplerConfig(
            num_steps=4, noise_level=0.7, forward_dtype="bf16" if device.startswith("cuda") else "auto"
        ),
        grpo=dataclasses.replace(get_preset("cpu_tiny_flow_grpo").grpo, num_minibatches=2),
    )
    trainer = GRPOTrainer(policy, config)
    return first_minibatch_ratio(trainer, trainer.collect(0))


def run_model_check(
    device: str = "cuda",
    widths: str = "real",
    resolution: int = 512,
    batch_size: int = 8,
    num_steps: int = 10,
    lora_rank: int = 64,
    workdir: str | None = None,
) -> dict:
    from workers.model.families.tiny import build_tiny_pipeline

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda, but torch sees no CUDA device; run with --device cpu --widths tiny")
    root = Path(workdir or tempfile.mkdtemp(prefix="spotlight-model-check-"))
    figures: dict = {
        "device": torch.cuda.get_device_name() if device.startswith("cuda") else "cpu",
        "widths": widths,
        "resolution": resolution,
        "batch_size": batch_size,
        "num_steps": num_steps,
    }
    paths = {
        n: build_tiny_pipeline("qwen-image", root / f"qwen-{widths}-{n}", widths=widths, num_layers=n) for n in (1, 2)
    }
    for mode, rank in (("lora", lora_rank), ("full", 0)):
        figures[mode] = _mode_figures(paths, device, resolution, rank, batch_size, num_steps)
    figures["vae_decode"] = vae_decode_peak(paths[1], device, resolution, chunk=GPU_ROLLOUT_BATCH)
    figures["fsdp_update"] = fsdp_update(paths[1], device, resolution, lora_rank)
    figures["load"] = load_times(paths[2])
    folders = {"qwen-image": paths[1], **{f: build_tiny_pipeline(f, root / f"{f}-tiny") for f in ("sd3", "flux")}}
    figures["presets"] = preset_checks(folders, device, resolution=resolution)
    return figures


def _mode_figures(paths: dict, device: str, resolution: int, rank: int, batch_size: int, num_steps: int) -> dict:
    """One mode's (LoRA or full) iteration at 2 blocks, its peak against blocks and batch fitted and extrapolated to
    60 blocks (`fit_memory`), PULSE throughput and the first minibatch's ratio drift."""
    one, two, double = (
        _one(paths[n], device, resolution, rank, b, num_steps)
        for n, b in ((1, batch_size), (2, batch_size), (1, 2 * batch_size))
    )
    figures = two
    if two["peak_memory_GB"] is not None:
        figures["peak_memory_per_block_GB"] = round(two["peak_memory_GB"] - one["peak_memory_GB"], 3)
    peaks = {(1, batch_size): one["peak_memory_GB"], (2, batch_size): two["peak_memory_GB"]}
    figures["memory_fit"] = fit_memory({**peaks, (1, 2 * batch_size): double["peak_memory_GB"]}, batch_size)
    figures["pulse"] = _pulse_after_update(paths[2], resolution, rank, device)
    figures["first_ratio_dev"] = _first_ratio(paths[1], resolution, rank, device)
    return figures
