"""A sweep's runs summarised over simulation seeds (mean and min-max), and set beside SPOTLIGHT's claims.

The claims (the SPOTLIGHT paper's): 1.4-6.4x lower total cost than the best baseline, the
same validation target 4x sooner, near-linear throughput from 8 to 64 spot GPUs. The best
baseline is taken per seed (the same market draw for every policy): the cheapest, or the
soonest to the target, of `roll`, `naive_spot` and `rlboost`.

Example:
    rows = sweep(base, times, market, curve, spot_gpus=[8, 64], policies=list(POLICIES), target=0.4, seeds=[0, 1, 2])
    print(summary_markdown(rows))
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Sequence

from workers.sim.config import POLICY_LABELS

BASELINES = ("roll", "naive_spot", "rlboost")
FIGURES = (
    "usd_total",
    "wall_h",
    "hours_to_target",
    "preemptions",
    "rollout_gpu_utilisation",
    "rollout_samples_per_s",
    "samples_per_hour",
)


def spread(values: Iterable[float | None]) -> dict[str, Any]:
    """Mean, min, max and count of the values that exist (None: a seed that never reached the target)."""
    xs = [v for v in values if v is not None]
    if not xs:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def by_policy(rows: Sequence[dict]) -> list[dict[str, Any]]:
    """One row per (spot GPUs, policy): each FIGURE's spread over the seeds."""
    keys = list(dict.fromkeys((r["spot_gpus"], r["policy"]) for r in rows))
    out = []
    for n, policy in keys:
        mine = [r for r in rows if r["spot_gpus"] == n and r["policy"] == policy]
        out.append(
            {"spot_gpus": n, "policy": policy, "seeds": len(mine), **{f: spread(r[f] for r in mine) for f in FIGURES}}
        )
    return out


def _ratios(rows: Sequence[dict], n: int, figure: str) -> list[float]:
    """Per seed: the best baseline's figure over spotlight's (> 1: spotlight is better)."""
    out = []
    for seed in sorted({r["seed"] for r in rows}):
        mine = {r["policy"]: r for r in rows if r["spot_gpus"] == n and r["seed"] == seed}
        base = [mine[p][figure] for p in BASELINES if p in mine and mine[p][figure] is not None]
        ours = mine.get("spotlight", {}).get(figure)
        if base and ours:
            out.append(min(base) / ours)
    return out


def against_paper(rows: Sequence[dict]) -> dict[str, Any]:
    """Cost and time-to-target ratios per spot-GPU count,
    and the throughput scaling from the fewest to the most GPUs."""
    counts = sorted({r["spot_gpus"] for r in rows})
    out: dict[str, Any] = {
        "cost_ratio": {n: spread(_ratios(rows, n, "usd_total")) for n in counts},
        "target_ratio": {n: spread(_ratios(rows, n, "hours_to_target")) for n in counts},
        "scaling": {},
    }
    lo, hi = counts[0], counts[-1]
    for policy in dict.fromkeys(r["policy"] for r in rows):
        for figure in ("rollout_samples_per_s", "samples_per_hour"):
            per_seed = []
            for seed in sorted({r["seed"] for r in rows}):
                a = [r[figure] for r in rows if r["policy"] == policy and r["seed"] == seed and r["spot_gpus"] == lo]
                b = [r[figure] for r in rows if r["policy"] == policy and r["seed"] == seed and r["spot_gpus"] == hi]
                if a and b and a[0]:
                    per_seed.append(b[0] / a[0])
            out["scaling"].setdefault(policy, {})[figure] = spread(per_seed)
    out["gpus"] = (lo, hi)
    return out


def _cell(s: dict, spec: str, scale: float = 1.0, unit: str = "") -> str:
    if s["mean"] is None:
        return "not reached"
    if unit:
        return _cell(s, spec, scale) + unit
    if s["min"] == s["max"]:
        return format(s["mean"] * scale, spec)
    return f"{format(s['mean'] * scale, spec)} ({format(s['min'] * scale, spec)}-{format(s['max'] * scale, spec)})"


def summary_markdown(rows: Sequence[dict]) -> str:
    """The table per policy and GPU count (mean, min-max over seeds), then the comparison with the paper's claims."""
    head = (
        "| spot GPUs | policy | total $ | wall h | h to target (seeds reaching it) | preemptions | rollout GPU util % "
        "| rollout samples/s | samples/h |\n|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in by_policy(rows):
        target = r["hours_to_target"]
        lines.append(
            f"| {r['spot_gpus']} | {POLICY_LABELS[r['policy']]} | {_cell(r['usd_total'], '.1f')} | "
            f"{_cell(r['wall_h'], '.2f')} | {_cell(target, '.2f')} ({target['n']}/{r['seeds']}) | "
            f"{_cell(r['preemptions'], '.1f')} | {_cell(r['rollout_gpu_utilisation'], '.0f', 100)} | "
            f"{_cell(r['rollout_samples_per_s'], '.1f')} | {_cell(r['samples_per_hour'], '.0f')} |"
        )
    paper = against_paper(rows)
    lines += [
        "",
        "| spot GPUs | best baseline $ / spotlight $ (paper: 1.4-6.4x) | best baseline h / spotlight h to target "
        "(paper: 4x) |",
        "|---|---|---|",
    ]
    for n, cost in paper["cost_ratio"].items():
        lines.append(f"| {n} | {_cell(cost, '.2f', unit='x')} | {_cell(paper['target_ratio'][n], '.2f', unit='x')} |")
    lo, hi = paper["gpus"]
    lines += [
        "",
        f"| policy | rollout samples/s, {hi} vs {lo} GPUs (ideal {hi / lo:g}x; paper: near-linear) | "
        f"end-to-end samples/h, {hi} vs {lo} GPUs |",
        "|---|---|---|",
    ]
    for policy, s in paper["scaling"].items():
        lines.append(
            f"| {POLICY_LABELS[policy]} | {_cell(s['rollout_samples_per_s'], '.2f', unit='x')} | "
            f"{_cell(s['samples_per_hour'], '.2f', unit='x')} |"
        )
    return "\n".join(lines)
