"""`spotlight bench memory --calibrate`: the figures the memory plan (workers/trainer/memory_plan.py) scales, measured
on one block of the real width on the CPU.

In a fresh process, on a pipeline of the real transformer width with 1 block (the real VAE shape):
- `saved_per_token_width`: the bytes autograd saves for backward inside the block (counted by
  `torch.autograd.graph.saved_tensors_hooks`, each storage once, parameters left out) per token per unit of width,
  over 4 bytes (FP32): what one block's activations cost a sample;
- `inference_per_token_width`: the peak RSS above the weights of a forward without gradients (the sampler's), per
  token per unit of width, over 4 bytes (the kernel's peak counter reset before it: /proc/self/clear_refs; a first
  forward before, since safetensors maps the weights and they count only once touched);
- `decode_bytes_per_pixel`: the VAE decode's peak RSS above its weights per output pixel of one image, over 4 bytes
  (a first decode before, for the same reason);
- the peak RSS of the whole forward and backward, for the record.

Example:
    figures = calibrate(CalibrationBench(model="/tmp/qwen-real-1"))
    figures["saved_per_token_width"]
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from workers.bench.memory import peak_rss_bytes, rss_bytes


@dataclass(frozen=True)
class CalibrationBench:
    model: str
    """A diffusers pipeline folder of the real width (e.g. `build_tiny_pipeline(..., widths="real", num_layers=1)`)."""
    resolution: int = 256
    batch: int = 2
    lora_rank: int = 64
    threads: int = 1

    def __post_init__(self):
        if not (Path(self.model) / "model_index.json").is_file():
            raise ValueError(f"model {self.model} is not a diffusers pipeline folder (no model_index.json)")
        if self.batch < 1 or self.threads < 1:
            raise ValueError("batch and threads must be >= 1")


def reset_peak_rss() -> None:
    """Set this process's peak RSS (VmHWM) to its RSS now (Linux: writing 5 to /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def _saved_bytes(policy, run) -> int:
    """Bytes autograd saves inside the transformer's blocks while `run()` runs (each storage once, no parameters)."""
    import torch

    from workers.trainer.fsdp import transformer_blocks

    params = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    seen: dict[int, int] = {}
    inside = [False]

    def pack(t):
        if inside[0] and isinstance(t, torch.Tensor) and t.device.type != "meta":
            ptr = t.untyped_storage().data_ptr()
            if ptr not in params:
                seen[ptr] = t.untyped_storage().nbytes()
        return t

    handles = []
    for block in transformer_blocks(policy.transformer):
        handles.append(block.register_forward_pre_hook(lambda *_: inside.__setitem__(0, True)))
        handles.append(block.register_forward_hook(lambda *_: inside.__setitem__(0, False)))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run()
    finally:
        for h in handles:
            h.remove()
    return sum(seen.values())


def measure(bench: CalibrationBench) -> dict:
    """Every figure, in this process (call it in a fresh one)."""
    import torch

    from workers.model.families.diffusers_policy import load_model_policy

    torch.set_num_threads(bench.threads)
    policy = load_model_policy(bench.model, resolution=bench.resolution, lora_rank=bench.lora_rank, base_dtype="fp32")
    cond, mask = policy.encode_prompts(["a photo of a red bicycle leaning on a green door"] * bench.batch)
    x = torch.randn(bench.batch, *policy.latent_shape)
    sigma = torch.full((bench.batch,), 0.5)
    tokens = x.shape[1] + next(v for v in cond.cond.values() if v.ndim == 3).shape[1]  # image + text tokens
    width = policy.transformer.config.num_attention_heads * policy.transformer.config.attention_head_dim
    unit = bench.batch * tokens * width * 4
    with torch.no_grad():  # a first forward pages the weights in (safetensors maps them) and fills lazy caches
        policy.velocity(x, sigma, cond, mask)
    loaded = rss_bytes()
    reset_peak_rss()
    with torch.no_grad():
        policy.velocity(x, sigma, cond, mask)
    inference = peak_rss_bytes() - loaded
    reset_peak_rss()
    before = rss_bytes()

    def step():
        policy.velocity(x, sigma, cond, mask).square().mean().backward()

    saved = _saved_bytes(policy, step)
    train_peak = peak_rss_bytes()
    policy.zero_grad(set_to_none=True)
    vae = policy.frozen.vae
    latent = torch.randn(1, *policy.latent_shape)
    policy.decode(latent, batch_size=1)  # pages the VAE's weights in before the decode is measured
    held = rss_bytes()
    reset_peak_rss()
    policy.decode(latent, batch_size=1)
    decode = peak_rss_bytes() - held
    return {
        "bench": {**bench.__dict__},
        "tokens": tokens,
        "width": width,
        "blocks": len(policy.transformer.transformer_blocks),
        "transformer_params_M": round(sum(p.numel() for p in policy.transformer.parameters()) / 1e6, 1),
        "vae_params_M": round(sum(p.numel() for p in vae.parameters()) / 1e6, 1),
        "rss_after_load_GB": round(loaded / 1e9, 3),
        "update_peak_rss_GB": round(train_peak / 1e9, 3),
        "update_peak_above_load_GB": round((train_peak - before) / 1e9, 3),
        "saved_in_blocks_GB": round(saved / 1e9, 3),
        "saved_per_token_width": round(saved / unit, 2),
        "inference_per_token_width": round(max(inference, 0) / unit, 2),
        "decode_peak_GB": round(decode / 1e9, 3),
        "decode_bytes_per_pixel": round(max(decode, 0) / (bench.resolution**2 * 4), 1),
    }


def calibrate(bench: CalibrationBench) -> dict:
    """`measure` in a fresh spawned process (its peak RSS is its own)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(measure, bench).result()


def format_calibration(figures: dict) -> str:
    b = figures["bench"]
    return "\n".join(
        [
            f"one block of width {figures['width']} ({figures['transformer_params_M']}M transformer parameters), "
            f"{b['resolution']} px, batch {b['batch']}, {figures['tokens']} tokens per sample, LoRA r={b['lora_rank']}",
            f"RSS after load {figures['rss_after_load_GB']} GB; update peak {figures['update_peak_rss_GB']} GB "
            f"(+{figures['update_peak_above_load_GB']} GB)",
            f"saved for backward in the block: {figures['saved_in_blocks_GB']} GB = "
            f"{figures['saved_per_token_width']} x samples x tokens x width x 4 B",
            f"no-grad forward peak above the weights: {figures['inference_per_token_width']} x samples x tokens x "
            "width x 4 B",
            f"VAE decode of one image: +{figures['decode_peak_GB']} GB = {figures['decode_bytes_per_pixel']} x pixels "
            "x 4 B",
        ]
    )
