"""`spotlight bench recipe`: does a training preset raise the held-out score, over several seeds?

Runs the preset from the shipped base once per run seed (prompt schedule and request
seeds differ; validation prompts and seeds are fixed), and reports the held-out strict
score before and after, its gain, the best score reached and the wall time. The issue's
bar is a gain of +0.15 within 15 minutes on 2 CPU cores.

Example:
    figures = bench_recipe("cpu_tiny", seeds=[0, 1, 2], progress=print)
    figures["gain_mean"], figures["runs"][0]["validation_curve"]
"""

from __future__ import annotations

import dataclasses
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from workers.coordinator.context import RunContext
from workers.coordinator.driver import train_records
from workers.model.tiny_policy import SHIPPED_BASE
from workers.trainer.presets import get_preset


def run_one(
    preset: str,
    seed: int,
    iterations: int | None = None,
    checkpoint=SHIPPED_BASE,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """One training run (`spotlight train`'s phases in a scratch run folder): the validation curve
    (iteration, strict, partial) and its wall time."""
    config = get_preset(preset)
    config = dataclasses.replace(config, seed=seed, iterations=iterations or config.iterations)
    curve, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="spotlight-recipe-") as run_dir:
        ctx = RunContext.local(
            Path(run_dir), f"recipe-{seed}", preset, config, checkpoint=str(checkpoint), report=False
        )
        for record in train_records(ctx):
            record["wall_s"] = round(time.perf_counter() - started, 1)
            if record["validation_score"] is not None:
                curve.append(
                    {
                        "iteration": record["iteration"],
                        "wall_s": record["wall_s"],
                        "strict": record["validation_score"],
                        "partial": record["validation_partial"],
                    }
                )
            if progress is not None:
                progress({"seed": seed, **record})
    start, end = curve[0], curve[-1]
    return {
        "seed": seed,
        "start_score": start["strict"],
        "final_score": end["strict"],
        "gain": round(end["strict"] - start["strict"], 6),
        "best_score": max(p["strict"] for p in curve),
        "start_partial": start["partial"],
        "final_partial": end["partial"],
        "wall_s": end["wall_s"],
        "validation_curve": curve,
    }


def bench_recipe(
    preset: str,
    seeds: list[int],
    iterations: int | None = None,
    checkpoint=SHIPPED_BASE,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """Figures over seeds: mean/min gain, final scores, minutes per run."""
    if not seeds:
        raise ValueError("give at least one seed (--seed 0 --seed 1 --seed 2)")
    get_preset(preset)  # an unknown preset fails before any compute
    if iterations is not None and iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    runs = [run_one(preset, s, iterations, checkpoint, progress) for s in seeds]
    gains = [r["gain"] for r in runs]
    return {
        "preset": preset,
        "num_seeds": len(runs),
        "start_score": runs[0]["start_score"],
        "final_score_mean": round(statistics.mean(r["final_score"] for r in runs), 6),
        "gain_mean": round(statistics.mean(gains), 6),
        "gain_min": round(min(gains), 6),
        "gain_std": round(statistics.pstdev(gains), 6),
        "partial_gain_mean": round(statistics.mean(r["final_partial"] - r["start_partial"] for r in runs), 6),
        "minutes_per_run": round(statistics.mean(r["wall_s"] for r in runs) / 60, 2),
        "torch_threads": torch.get_num_threads(),
        "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
        "runs": runs,
    }
