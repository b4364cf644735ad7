"""The memory and loading side of `spotlight bench model-check`: what a 60-block Qwen-Image run would need, from
measurements on 1 and 2 of its blocks.

- `fit_memory`: the training iteration's peak device memory is taken as linear in blocks and in batch; the slopes
  come from peaks at (1 block, batch b), (2 blocks, b) and (1 block, 2b), and the fit extrapolates to the real
  model's 60 blocks, then adds the text encoder when it stays resident (Qwen2.5-VL-7B in BF16).
- `vae_decode_peak`: the VAE decode's peak for one chunk and for two chunks decoded chunk by chunk (equal when the
  chunking bounds the peak, as `--rollout-batch` means it to).
- `fsdp_update`: one FSDP2 update (a process group of one: NCCL on a GPU, gloo on the CPU) with gradient
  checkpointing and, under LoRA with NFT, the v_old adapter swaps.
- `load_times`: the transformer's `from_pretrained` with and without `low_cpu_mem_usage`, and the empty build
  sharded loading gives the ranks other than 0.

Example:
    fit_memory({(1, 8): 20.1, (2, 8): 21.0, (1, 16): 24.3}, batch=8)["peak_60_blocks_GB"]   # 73.2
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

FULL_BLOCKS = 60
"""Qwen-Image's transformer blocks."""
TEXT_ENCODER_GB = 16.6
"""Qwen2.5-VL-7B (8.3B parameters) in BF16: what the text encoder adds while it is loaded."""


def fit_memory(peaks_GB: dict[tuple[int, int], float | None], batch: int, blocks: int = FULL_BLOCKS) -> dict:
    """Slopes of the peak per block and per sample from peaks at (1, batch), (2, batch), (1, 2 x batch), and the
    peak extrapolated to `blocks` blocks at `batch` (without and with the text encoder). None figures when a peak
    is missing (the CPU has no device peak)."""
    one, two, double = peaks_GB.get((1, batch)), peaks_GB.get((2, batch)), peaks_GB.get((1, 2 * batch))
    if None in (one, two, double):
        return {"per_block_GB": None, "per_sample_GB": None, "peak_60_blocks_GB": None, "with_text_encoder_GB": None}
    per_block, per_sample = two - one, (double - one) / batch
    at_blocks = one + (blocks - 1) * per_block
    return {
        "per_block_GB": round(per_block, 3),
        "per_sample_GB": round(per_sample, 4),
        "peak_60_blocks_GB": round(at_blocks, 2),
        "with_text_encoder_GB": round(at_blocks + TEXT_ENCODER_GB, 2),
    }


def _device_peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _device_peak_GB(device: str) -> float | None:
    return round(torch.cuda.max_memory_allocated() / 1e9, 3) if device.startswith("cuda") else None


def _policy(path: Path, device: str, resolution: int, lora_rank: int):
    from workers.model.policy_loader import load_any

    dtype = "bf16" if device.startswith("cuda") else "fp32"
    return load_any(path, resolution=resolution, lora_rank=lora_rank, base_dtype=dtype).to(device)


def vae_decode_peak(path: Path, device: str, resolution: int, chunk: int) -> dict:
    """Peak device memory and seconds of decoding `chunk` latents, then 2 x `chunk` in chunks of `chunk`."""
    from workers.task.render import decode_images

    policy = _policy(path, device, resolution, lora_rank=0)
    latents = torch.randn(2 * chunk, *policy.latent_shape, device=device)
    figures = {"chunk": chunk}
    for name, count in (("one_chunk", chunk), ("two_chunks", 2 * chunk)):
        _device_peak_reset(device)
        t0 = time.perf_counter()
        with torch.no_grad():
            for start in range(0, count, chunk):
                decode_images(policy, latents[start : start + chunk])
        figures[f"{name}_s"] = round(time.perf_counter() - t0, 3)
        figures[f"{name}_peak_GB"] = _device_peak_GB(device)
    return figures


def fsdp_update(path: Path, device: str, resolution: int, lora_rank: int) -> dict:
    """One NFT update through FSDP2 (one rank) with gradient checkpointing: seconds, gradient norm, steps."""
    import torch.distributed as dist

    from workers.algo.sampler import SamplerConfig
    from workers.trainer.fsdp import FSDPConfig, distribute, init_distributed
    from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig
    from workers.trainer.memory import enable_gradient_checkpointing
    from workers.trainer.presets import get_preset

    policy = _policy(path, device, resolution, lora_rank)
    config = TrainConfig(
        prompts_per_iteration=1,
        group_size=4,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=2, noise_level=0.0),
        grpo=get_preset("cpu_tiny").grpo,
    )
    trainer = GRPOTrainer(policy, config)  # NFT: under LoRA v_old is an adapter swapped in on the same blocks
    batch = trainer.collect(0)
    owned = not dist.is_initialized()
    with tempfile.TemporaryDirectory(prefix="spotlight-fsdp-check-") as folder:
        mesh = init_distributed("cuda" if device.startswith("cuda") else "cpu", f"file://{folder}/init", 0, 1)
        try:
            enable_gradient_checkpointing(policy)
            distribute(trainer, mesh, FSDPConfig(mixed_precision=device.startswith("cuda")))
            _device_peak_reset(device)
            t0 = time.perf_counter()
            stats = trainer.update(batch)
            seconds = time.perf_counter() - t0
        finally:
            if owned:
                dist.destroy_process_group()
    return {
        "update_s": round(seconds, 3),
        "grad_norm": stats.get("grad_norm"),
        "optimizer_steps": stats["optimizer_steps"],
        "peak_GB": _device_peak_GB(device),
    }


def load_times(path: Path) -> dict:
    """Seconds to load the folder's transformer (FP32, CPU) with `low_cpu_mem_usage` False and True, and to build it
    empty (what sharded loading does on the ranks other than 0)."""
    import diffusers

    from workers.model.families.model_spec import ModelSpec
    from workers.model.families.registry import family_for

    spec = ModelSpec(path=str(path), family="qwen-image")
    family = family_for("qwen-image")
    cls = getattr(diffusers, family.transformer_class)
    figures = {}
    for low in (False, True):
        t0 = time.perf_counter()
        cls.from_pretrained(
            path, subfolder="transformer", torch_dtype=torch.float32, local_files_only=True, low_cpu_mem_usage=low
        )
        figures[f"load_s_low_cpu_mem_usage_{str(low).lower()}"] = round(time.perf_counter() - t0, 3)
    t0 = time.perf_counter()
    family.load_transformer(spec, torch.float32, empty=True)
    figures["build_empty_s"] = round(time.perf_counter() - t0, 3)
    return figures
