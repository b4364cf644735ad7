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
import re
import tempfile
import time
from pathlib import Path

from workers.pulse.loco.launch import LocoRun, LocoRunConfig, run_loco, sync_totals
from workers.pulse.loco.tasks import TaskConfig
from workers.pulse.loco.transport import ExchangeConfig

MODES = ("ddp", "diloco", "pulseloco")
TARGETS = {"bytes_ratio_vs_diloco": 17.0, "bytes_ratio_vs_ddp": 100.0, "sparsity": 0.94}
"""The PULSELoCo targets (all `>=`), from the PULSE paper's 7B figures."""
EXCHANGE = ExchangeConfig(timeout_s=3600.0, missing_policy="wait")
"""A round waits long: replica 0 evaluates while the others wait, on a loaded shared machine."""
RUN_TIMEOUT_S = 8 * 3600.0
"""Safety net per run (all modes of one task and lr)."""
PAPER = {
    "source": "PULSE, arXiv 2602.03839 (grail v6 PULSELoCo), 7B model",
    "sparsity": [0.948, 0.964],
    "pulseloco_bytes": 1.77e9,
    "diloco_bytes": 30.5e9,
    "bytes_ratio_vs_diloco": 30.5 / 1.77,
}


def lm_runs(quick: bool) -> dict[str, LocoRunConfig]:
    """(b) The LM-shaped task: 54.7M parameters at RL learning rates 1e-6 and 3e-6 over 4 rounds, and
    the 0.5M LM over 24 rounds (how sparsity and the lag behind DiLoCo evolve once error feedback
    has run a while). Quick: the 0.5M LM, 2 rounds."""
    if quick:
        task = TaskConfig(name="lm", size="tiny", lr=1e-6, warmup_steps=10, settle_steps=10, eval_batches=2)
        return {"lr=1e-06": LocoRunConfig(modes=MODES, rounds=2, inner_steps=4, task=task, exchange=EXCHANGE)}
    runs = {}
    for lr in (1e-6, 3e-6):
        task = TaskConfig(name="lm", size="50m", lr=lr, warmup_steps=30, settle_steps=150, eval_batches=8)
        runs[f"lr={lr:g}"] = LocoRunConfig(modes=MODES, rounds=4, inner_steps=8, task=task, exchange=EXCHANGE)
    task = TaskConfig(name="lm", size="tiny", lr=1e-6, warmup_steps=30, settle_steps=150, eval_batches=8)
    runs["0.5M, lr=1e-06, 24 rounds"] = LocoRunConfig(
        modes=MODES, rounds=24, inner_steps=8, task=task, exchange=EXCHANGE
    )
    return runs


def dit_runs(quick: bool) -> dict[str, LocoRunConfig]:
    """(a) The shipped tiny DiT under the default GRPO recipe (cpu_tiny) at lr 3e-6 (PULSE's RL
    regime), fresh AdamW on each replica."""
    if quick:
        task = TaskConfig(name="dit", lr=3e-6, batch_size=1, group_size=2, eval_batches=1)
        return {"lr=3e-06": LocoRunConfig(modes=MODES, rounds=1, inner_steps=2, task=task, exchange=EXCHANGE)}
    # Sized for the shared 2-core machine: 3 rounds of H=8 steps, 2 prompts x 4 samples each,
    # 8 held-out prompts x 2 seeds.
    task = TaskConfig(name="dit", lr=3e-6, batch_size=2, group_size=4, eval_batches=8)
    return {"lr=3e-06": LocoRunConfig(modes=MODES, rounds=3, inner_steps=8, task=task, exchange=EXCHANGE)}


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
                folder = re.sub(r"[^A-Za-z0-9.]+", "-", f"{name}-{label}")
                run = run_loco(config, root / folder, timeout_s=RUN_TIMEOUT_S)
                figures[name][label] = summarise(config, run)
    figures["wall_s"] = time.perf_counter() - start
    return figures


def summarise(config: LocoRunConfig, run: LocoRun) -> dict:
    """Per mode: bytes per replica, sparsity, curves; then PULSELoCo against DiLoCo and DDP."""
    failed = {r: code for r, code in run.exit_codes.items() if code != 0}
    if failed:
        raise RuntimeError(f"replicas {failed} exited with errors; see their reports")
    task = config.task
    out: dict = {
        "task": dataclasses.asdict(task),
        "num_replicas": config.num_replicas,
        "rounds": config.rounds,
        "inner_steps": config.inner_steps,
        "local_steps": config.rounds * config.inner_steps,
        "transport": config.transport,
        "wall_s": run.wall_s,
        "modes": {},
    }
    for mode in config.modes:
        out["modes"][mode] = _mode_figures(run, mode)
    ddp, diloco, pulse = (out["modes"][m] for m in MODES)
    out["numel"] = pulse["numel"]
    out["bytes_ratio_vs_diloco"] = diloco["bytes_per_replica"] / pulse["bytes_per_replica"]
    out["bytes_ratio_vs_ddp"] = ddp["bytes_per_replica"] / pulse["bytes_per_replica"]
    out["sparsity"] = pulse["sparsity"]
    for view in ("", "bf16_"):
        diff, noise = _paired_diff(pulse[f"final_{view}values"], diloco[f"final_{view}values"])
        out[f"final_{view}metric_diff_vs_diloco"] = diff
        out[f"final_{view}metric_noise_2se"] = noise
        out[f"final_{view}metric_within_noise"] = abs(diff) <= noise
    moved = diloco["eval_curve"][-1] - diloco["eval_curve"][0]
    out["progress_ratio_vs_diloco"] = (pulse["eval_curve"][-1] - pulse["eval_curve"][0]) / moved if moved else None
    out["weights_identical_every_round"] = all(m["weights_identical_every_round"] for m in out["modes"].values())
    out["targets_met"] = {name: out[name] >= target for name, target in TARGETS.items()}
    return out


def _paired_diff(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean of a - b over the same held-out items, and twice its standard error (paired)."""
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    mean = sum(diffs) / len(diffs)
    var = sum((d - mean) ** 2 for d in diffs) / max(1, len(diffs) - 1)
    return mean, 2 * math.sqrt(var / len(diffs))


def _mode_figures(run: LocoRun, mode: str) -> dict:
    rows = sync_totals(run, mode)
    starts = [e for e in run.events if e["event"] == "start" and e["mode"] == mode and e["replica"] == 0]
    by_round = {e["round"]: e for e in run.rounds(mode) if e["replica"] == 0}
    evaluated = [starts[0]] + [by_round[r] for r in sorted(by_round) if by_round[r]["eval_metric"] is not None]
    last = evaluated[-1]
    density = sum(r["density"] for r in rows) / len(rows)
    values = sum(e["values_sent"] for e in run.rounds(mode)) / len(run.rounds(mode))
    return {
        "numel": rows[0]["numel"],
        "bytes_per_replica": sum(r["bytes_per_replica"] for r in rows),
        "bytes_per_replica_by_round": [r["bytes_per_replica"] for r in rows],
        "sparsity": 1.0 - density,
        "sparsity_by_round": [1.0 - r["density"] for r in rows],
        "bytes_per_sent_value": sum(r["bytes_per_replica"] for r in rows) / (values * len(rows)) if values else None,
        "eval_rounds": [0] + [e["round"] + 1 for e in evaluated[1:]],
        "eval_curve": [e["eval_metric"] for e in evaluated],
        "eval_bf16_curve": [e["eval_bf16_metric"] for e in evaluated],
        "train_curve": [by_round[r]["train_metric"] for r in sorted(by_round)],
        "final_metric": last["eval_metric"],
        "final_stderr": last["eval_stderr"],
        "final_bf16_metric": last["eval_bf16_metric"],
        "final_values": last["eval_values"],
        "final_bf16_values": last["eval_bf16_values"],
        "sync_s_per_round": sum(e["sync_s"] for e in run.rounds(mode)) / len(run.rounds(mode)),
        "weights_identical_every_round": all(r["weights_hash"] is not None for r in rows),
    }


def format_loco_report(figures: dict) -> str:
    """A plain-text table per task and learning rate."""
    lines = []
    for name, title in (("dit", "(a) tiny DiT, GRPO"), ("lm", "(b) LM-shaped task")):
        for label, run in figures.get(name, {}).items():
            lines.append(
                f"{title}, {label}: {run['numel']:,} parameters, {run['num_replicas']} replicas, "
                f"{run['rounds']} rounds x H={run['inner_steps']} local steps ({run['wall_s']:.0f} s)"
            )
            lines.append(
                f"  {'mode':<10} {'MB/replica':>11} {'sparsity':>9} {'B/value':>8}  "
                "held-out metric: FP32 curve | BF16 view, final"
            )
            for mode in MODES:
                m = run["modes"][mode]
                per_value = "" if m["bytes_per_sent_value"] is None else f"{m['bytes_per_sent_value']:.2f}"
                curve = ", ".join(f"{v:.5f}" for v in m["eval_curve"])
                lines.append(
                    f"  {mode:<10} {m['bytes_per_replica'] / 1e6:>11.3f} {m['sparsity']:>9.2%} {per_value:>8}  "
                    f"{curve} | {m['final_bf16_metric']:.5f}"
                )
            met = run["targets_met"]
            lines.append(
                f"  PULSELoCo: {run['bytes_ratio_vs_diloco']:.1f}x fewer bytes than DiLoCo "
                f"({_met(met, 'bytes_ratio_vs_diloco')}), "
                f"{run['bytes_ratio_vs_ddp']:.0f}x than DDP ({_met(met, 'bytes_ratio_vs_ddp')}), "
                f"sparsity {run['sparsity']:.2%} ({_met(met, 'sparsity')})"
            )
            progress = run["progress_ratio_vs_diloco"]
            lines.append(
                f"  final metric vs DiLoCo, paired over the held-out items: FP32 {_diff(run, '')}, BF16 view "
                f"{_diff(run, 'bf16_')}; progress {'n/a' if progress is None else f'{progress:.2f}'} of DiLoCo's; "
                f"identical weights every round: {run['weights_identical_every_round']}"
            )
    lines.append(
        f"paper (7B): sparsity 94.8-96.4 %, 1.77 GB vs 30.5 GB for DiLoCo ({PAPER['bytes_ratio_vs_diloco']:.1f}x)"
    )
    if figures["quick"]:
        lines.append("quick run: a smoke test; the targets belong to the full run")
    return "\n".join(lines)


def _diff(run: dict, view: str) -> str:
    within = "within" if run[f"final_{view}metric_within_noise"] else "OUTSIDE"
    return (
        f"{run[f'final_{view}metric_diff_vs_diloco']:+.5f} ({within} 2 s.e. {run[f'final_{view}metric_noise_2se']:.5f})"
    )


def _met(met: dict, name: str) -> str:
    return f"target >= {TARGETS[name]:g} met" if met[name] else f"target >= {TARGETS[name]:g} MISSED"


def plot_loco_curves(figures: dict, path: Path) -> None:
    """One panel per task and learning rate: the held-out metric of each mode against local steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(name, label, run) for name in ("dit", "lm") for label, run in figures.get(name, {}).items()]
    if not panels:
        raise ValueError("the figures hold no run to plot (expected a 'dit' or 'lm' section)")
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4), squeeze=False)
    for ax, (name, label, run) in zip(axes[0], panels, strict=False):
        for mode, style in zip(MODES, ("-s", "-o", "--^"), strict=False):
            m = run["modes"][mode]
            steps = [r * run["inner_steps"] for r in m["eval_rounds"]]
            ax.plot(steps, m["eval_curve"], style, label=f"{mode} ({m['bytes_per_replica'] / 1e6:.2f} MB/replica)")
        metric = "held-out partial score" if name == "dit" else "held-out cross-entropy"
        ax.set_title(f"({name}) {label}, {run['numel'] / 1e6:.1f}M params, {run['num_replicas']} replicas", fontsize=9)
        ax.set_xlabel("local steps per replica")
        ax.set_ylabel(metric)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    """Plot a saved `spotlight bench loco --json`: `python -m workers.bench.loco FIGURES.json OUT.png`."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Training curves of a `spotlight bench loco --json` result.")
    parser.add_argument("figures", type=Path, help="JSON printed by `spotlight bench loco --json`")
    parser.add_argument("png", type=Path, help="where to write the plot")
    args = parser.parse_args(argv)
    try:
        figures = json.loads(args.figures.read_text())
    except (OSError, json.JSONDecodeError) as err:
        parser.error(f"cannot read {args.figures}: {err}")
    plot_loco_curves(figures, args.png)


if __name__ == "__main__":
    main()
