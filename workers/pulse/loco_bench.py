"""`spotlight bench loco`: bytes, sparsity and training curves of DDP, DiLoCo and PULSELoCo.

Every mode runs as real replica processes (gloo) from the same start over the same
number of local steps: (a) the tiny DiT's GRPO on MiniGenEval and (b) the LM-shaped
synthetic task of `bench pulse`. Bytes are the payload each replica hands its transport
per round (DDP: one FP32 gradient per local step; for two replicas a ring all-reduce
moves exactly this much per replica).

Example:
    figures = run_loco_bench(quick=True)
    figures["lm"]["lr=1e-06"]["bytes_ratio_vs_diloco"]
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from pathlib import Path

from workers.pulse.loco_launch import LocoRunConfig, LocoRun, run_loco, sync_totals
from workers.pulse.loco_tasks import TaskConfig

MODES = ("ddp", "diloco", "pulseloco")
TARGETS = {"bytes_ratio_vs_diloco": 17.0, "bytes_ratio_vs_ddp": 100.0, "sparsity": 0.94}
"""Issue 8's targets (all `>=`), from the PULSE paper's 7B figures."""
PAPER = {
    "source": "PULSE, arXiv 2602.03839 (grail v6 PULSELoCo), 7B model",
    "sparsity": [0.948, 0.964],
    "pulseloco_bytes": 1.77e9,
    "diloco_bytes": 30.5e9,
    "bytes_ratio_vs_diloco": 30.5 / 1.77,
}


def lm_runs(quick: bool) -> dict[str, LocoRunConfig]:
    """(b) The LM-shaped task: 54.7M parameters at RL learning rates 1e-6 and 3e-6 (quick: 0.5M, one lr)."""
    if quick:
        task = TaskConfig(name="lm", size="tiny", lr=1e-6, warmup_steps=10, settle_steps=10, eval_batches=2)
        return {"lr=1e-06": LocoRunConfig(modes=MODES, rounds=2, inner_steps=4, task=task)}
    runs = {}
    for lr in (1e-6, 3e-6):
        task = TaskConfig(name="lm", size="50m", lr=lr, warmup_steps=30, settle_steps=150, eval_batches=8)
        runs[f"lr={lr:g}"] = LocoRunConfig(modes=MODES, rounds=4, inner_steps=8, task=task)
    return runs


def dit_runs(quick: bool) -> dict[str, LocoRunConfig]:
    """(a) The shipped tiny DiT under GRPO at lr 3e-6 (PULSE's RL regime), fresh AdamW on each replica."""
    if quick:
        task = TaskConfig(name="dit", lr=3e-6, batch_size=1, group_size=2, eval_batches=1)
        return {"lr=3e-06": LocoRunConfig(modes=MODES, rounds=1, inner_steps=2, task=task)}
    # Sized for the shared 2-core machine: 2 rounds of H=8 GRPO steps, 2 prompts x 4 samples each.
    task = TaskConfig(name="dit", lr=3e-6, batch_size=2, group_size=4, eval_batches=4)
    return {"lr=3e-06": LocoRunConfig(modes=MODES, rounds=2, inner_steps=8, task=task)}


def run_loco_bench(quick: bool = False, dit: bool = True, lm: bool = True, out: Path | None = None) -> dict:
    """Figures of every run; `out` keeps the replicas' reports (default: a temporary folder)."""
    start = time.perf_counter()
    figures: dict = {"quick": quick, "paper": PAPER, "targets": {k: f">= {v}" for k, v in TARGETS.items()}}
    with tempfile.TemporaryDirectory(prefix="loco-bench-") as scratch:
        root = out or Path(scratch)
        for name, runs, wanted in (("dit", dit_runs(quick), dit), ("lm", lm_runs(quick), lm)):
            if not wanted:
                continue
            figures[name] = {}
            for label, config in runs.items():
                run = run_loco(config, root / f"{name}-{label.replace('=', '')}")
                figures[name][label] = summarise(config, run)
    figures["wall_s"] = time.perf_counter() - start
    return figures


def summarise(config: LocoRunConfig, run: LocoRun) -> dict:
    """Per mode: bytes per replica, sparsity, curve; then PULSELoCo against DiLoCo and DDP."""
    failed = {r: code for r, code in run.exit_codes.items() if code != 0}
    if failed:
        raise RuntimeError(f"replicas {failed} exited with errors; see their reports")
    task = config.task
    out: dict = {"task": dataclasses.asdict(task), "num_replicas": config.num_replicas, "rounds": config.rounds,
                 "inner_steps": config.inner_steps, "local_steps": config.rounds * config.inner_steps,
                 "transport": config.transport, "wall_s": run.wall_s, "modes": {}}
    for mode in config.modes:
        out["modes"][mode] = _mode_figures(run, mode)
    ddp, diloco, pulse = (out["modes"][m] for m in MODES)
    out["numel"] = pulse["numel"]
    out["bytes_ratio_vs_diloco"] = diloco["bytes_per_replica"] / pulse["bytes_per_replica"]
    out["bytes_ratio_vs_ddp"] = ddp["bytes_per_replica"] / pulse["bytes_per_replica"]
    out["sparsity"] = pulse["sparsity"]
    diff = pulse["final_metric"] - diloco["final_metric"]
    noise = 2 * math.hypot(pulse["final_stderr"], diloco["final_stderr"])
    out["final_metric_diff_vs_diloco"] = diff
    out["final_metric_noise_2se"] = noise
    out["final_metric_within_noise"] = abs(diff) <= noise
    out["weights_identical_every_round"] = all(m["weights_identical_every_round"] for m in out["modes"].values())
    out["targets_met"] = {name: out[name] >= target for name, target in TARGETS.items()}
    return out


def _mode_figures(run: LocoRun, mode: str) -> dict:
    rows = sync_totals(run, mode)
    starts = [e for e in run.events if e["event"] == "start" and e["mode"] == mode and e["replica"] == 0]
    by_round = {e["round"]: e for e in run.rounds(mode) if e["replica"] == 0}
    curve = [starts[0]["eval_metric"]] + [by_round[r]["eval_metric"] for r in sorted(by_round)]
    last = by_round[max(by_round)]
    density = sum(r["density"] for r in rows) / len(rows)
    values = sum(e["values_sent"] for e in run.rounds(mode)) / len(run.rounds(mode))
    return {
        "numel": rows[0]["numel"],
        "bytes_per_replica": sum(r["bytes_per_replica"] for r in rows),
        "bytes_per_replica_by_round": [r["bytes_per_replica"] for r in rows],
        "sparsity": 1.0 - density,
        "sparsity_by_round": [1.0 - r["density"] for r in rows],
        "bytes_per_sent_value": sum(r["bytes_per_replica"] for r in rows) / (values * len(rows)) if values else None,
        "eval_curve": curve,
        "train_curve": [by_round[r]["train_metric"] for r in sorted(by_round)],
        "final_metric": last["eval_metric"],
        "final_stderr": last["eval_stderr"],
        "sync_s_per_round": sum(e["sync_s"] for e in run.rounds(mode)) / len(run.rounds(mode)),
        "weights_identical_every_round": all(r["weights_hash"] is not None for r in rows),
    }


def format_loco_report(figures: dict) -> str:
    """A plain-text table per task and learning rate."""
    lines = []
    for name, title in (("dit", "(a) tiny DiT, GRPO"), ("lm", "(b) LM-shaped task")):
        for label, run in figures.get(name, {}).items():
            lines.append(f"{title}, {label}: {run['numel']:,} parameters, {run['num_replicas']} replicas, "
                         f"{run['rounds']} rounds x H={run['inner_steps']} local steps ({run['wall_s']:.0f} s)")
            lines.append(f"  {'mode':<10} {'MB/replica':>11} {'sparsity':>9} {'B/value':>8}  final metric (eval curve)")
            for mode in MODES:
                m = run["modes"][mode]
                per_value = "" if m["bytes_per_sent_value"] is None else f"{m['bytes_per_sent_value']:.2f}"
                curve = ", ".join(f"{v:.4f}" for v in m["eval_curve"])
                lines.append(f"  {mode:<10} {m['bytes_per_replica'] / 1e6:>11.3f} {m['sparsity']:>9.2%} {per_value:>8}  "
                             f"{m['final_metric']:.4f} ± {m['final_stderr']:.4f} ({curve})")
            met = run["targets_met"]
            lines.append(f"  PULSELoCo: {run['bytes_ratio_vs_diloco']:.1f}x fewer bytes than DiLoCo ({_met(met, 'bytes_ratio_vs_diloco')}), "
                         f"{run['bytes_ratio_vs_ddp']:.0f}x than DDP ({_met(met, 'bytes_ratio_vs_ddp')}), "
                         f"sparsity {run['sparsity']:.2%} ({_met(met, 'sparsity')}); final metric {run['final_metric_diff_vs_diloco']:+.4f} "
                         f"vs DiLoCo (2 s.e. {run['final_metric_noise_2se']:.4f}); identical weights every round: "
                         f"{run['weights_identical_every_round']}")
    lines.append(f"paper (7B): sparsity 94.8-96.4 %, 1.77 GB vs 30.5 GB for DiLoCo ({PAPER['bytes_ratio_vs_diloco']:.1f}x)")
    if figures["quick"]:
        lines.append("quick run: a smoke test; the targets belong to the full run")
    return "\n".join(lines)


def _met(met: dict, name: str) -> str:
    return f"target >= {TARGETS[name]:g} met" if met[name] else f"target >= {TARGETS[name]:g} MISSED"
