"""`spotlight bench memory`: peak host memory (RSS) of one training iteration against the samples per iteration.

Each measurement runs in a fresh process (peak RSS is a process's high-water mark): it loads the pipeline folder
as a LoRA policy, samples and decodes the iteration `rollout_batch` requests at a time, scores them, and takes the
GRPO update in micro-batches of `micro_batch`. With chunks everywhere, a 64-sample iteration should need about
what an 8-sample one needs: what grows with the iteration is only the CPU-side trajectory and the uint8 images.
On a CPU the figures are host RSS; the GPU's peaks are `spotlight bench model-check`'s.

Example:
    figures = run_memory_bench(MemoryBench(model="/tmp/qwen-real-2", samples=(8, 64), rollout_batch=8))
    figures["ratio"]                          # peak RSS at 64 samples / at 8
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path


@dataclass(frozen=True)
class MemoryBench:
    model: str
    """A diffusers pipeline folder (e.g. `build_tiny_pipeline("qwen-image", DIR, widths="real", num_layers=2)`)."""
    samples: tuple[int, ...] = (8, 64)
    """Samples per iteration measured, each in a fresh process; each a multiple of group_size."""
    rollout_batch: int | None = 8
    """Samples sampled and decoded together (None: the whole iteration at once)."""
    micro_batch: int | None = 8
    """Samples per forward and backward in the update (None: the whole minibatch)."""
    group_size: int = 8
    resolution: int = 128
    num_steps: int = 2
    """Denoising steps (every one an SDE step, so every one is trained)."""
    num_minibatches: int = 1
    lora_rank: int = 64
    guidance: float = 4.5
    """True CFG as the GPU presets run it: two transformer passes per step."""
    threads: int = 2

    def __post_init__(self):
        if not self.samples or any(s < self.group_size or s % self.group_size for s in self.samples):
            raise ValueError(f"samples must be multiples of group_size={self.group_size}, got {self.samples}")
        for name in ("rollout_batch", "micro_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.num_steps < 1 or self.threads < 1 or self.num_minibatches < 1:
            raise ValueError("num_steps, threads and num_minibatches must be >= 1")
        if not (Path(self.model) / "model_index.json").is_file():
            raise ValueError(f"model {self.model} is not a diffusers pipeline folder (no model_index.json)")


def rss_bytes() -> int:
    """This process's resident set now (Linux /proc)."""
    import os

    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """This process's peak resident set (Linux VmHWM). Not ru_maxrss: that survives exec, so a spawned child would
    report its parent's resident set at the fork whenever that was higher than its own peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status: the memory runs need Linux")


def measure_iteration(bench: MemoryBench, num_samples: int) -> dict:
    """One iteration of `num_samples` in this process: RSS after loading, peak RSS, seconds per part."""
    import torch

    from workers.algo.grpo import GRPOConfig
    from workers.algo.sampler import SamplerConfig
    from workers.model.families.diffusers_policy import load_model_policy
    from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig

    torch.set_num_threads(bench.threads)
    policy = load_model_policy(
        bench.model, resolution=bench.resolution, lora_rank=bench.lora_rank, guidance=bench.guidance, base_dtype="fp32"
    )
    config = TrainConfig(
        iterations=1,
        prompts_per_iteration=num_samples // bench.group_size,
        group_size=bench.group_size,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=bench.num_steps, noise_level=1.2, forward_dtype="fp32"),
        grpo=GRPOConfig(lr=3e-4, clip_range=1e-4, adv_clip=5.0, kl_beta=0.0, num_minibatches=bench.num_minibatches),
        rollout_batch=bench.rollout_batch,
        micro_batch=bench.micro_batch,
    )
    trainer = GRPOTrainer(policy, config)
    policy.encode_prompts(["warm up"])  # the text encoder loads here, not inside the measured iteration
    loaded = rss_bytes()
    t0 = time.perf_counter()
    batch = trainer.collect(0)
    t1 = time.perf_counter()
    stats = trainer.update(batch)
    t2 = time.perf_counter()
    return {
        "samples": num_samples,
        "rss_after_load_GB": round(loaded / 1e9, 3),
        "peak_rss_GB": round(peak_rss_bytes() / 1e9, 3),
        "collect_s": round(t1 - t0, 1),
        "update_s": round(t2 - t1, 1),
        "optimizer_steps": stats["optimizer_steps"],
        "transformer_params_M": round(sum(p.numel() for p in policy.transformer.parameters()) / 1e6, 1),
        "vae_params_M": round(sum(p.numel() for p in policy.frozen.vae.parameters()) / 1e6, 1),
    }


def run_memory_bench(bench: MemoryBench, progress=lambda line: None) -> dict:
    """Every `bench.samples` measured in a fresh spawned process, and the peak ratio of the largest to the
    smallest."""
    rows = []
    for n in bench.samples:
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            rows.append(pool.submit(measure_iteration, bench, n).result())
        progress(f"{n} samples: peak RSS {rows[-1]['peak_rss_GB']} GB")
    small, large = min(rows, key=lambda r: r["samples"]), max(rows, key=lambda r: r["samples"])
    return {
        "bench": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(bench).items()},
        "runs": rows,
        "ratio": round(large["peak_rss_GB"] / small["peak_rss_GB"], 3),
    }


def format_memory_report(figures: dict) -> str:
    lines = [f"{'samples':>8} {'after load GB':>14} {'peak RSS GB':>12} {'collect s':>10} {'update s':>9}"]
    for r in figures["runs"]:
        lines.append(
            f"{r['samples']:>8} {r['rss_after_load_GB']:>14} {r['peak_rss_GB']:>12} {r['collect_s']:>10} "
            f"{r['update_s']:>9}"
        )
    lines.append(f"peak ratio, most / fewest samples: {figures['ratio']}")
    return "\n".join(lines)
