"""The figures of `spotlight bench exploration`: learning curves over seeds, seconds per iteration, and their product.

- `summarize_learning`: per strategy the mean held-out curve over run seeds and the final
  gain (mean and standard error); per target the iterations each mean curve needs, and
  the paired-bootstrap ratios random / explore and wider_draw / explore; paired
  differences of final and mean held-out scores; what exploration planned (arms, Kendall
  tau of stale, cheap rankings, variance of explored vs random groups).
- `summarize_timing`: per strategy the critical-path seconds per iteration and per phase.
- `time_to_target`: the headline, (iterations ratio) x (seconds-per-iteration ratio).

Example:
    learning = summarize_learning(records, base_score=0.297, target_gains=(0.08,), resamples=2000)
    figures = time_to_target(learning, summarize_timing(timing_runs), 0.08)
    figures["time_to_target_speedup"], figures["time_to_target_speedup_interval"]
"""

from __future__ import annotations

import statistics

import numpy as np

from workers.bench.curves import crossing, mean_curve, paired_difference, paired_ratio_interval
from workers.bench.exploration_learning import STRATEGIES

SLOWER = ("random", "wider_draw", "random_wide")
"""The strategies explore is compared with (each ratio is theirs over explore's)."""


def _by_strategy(records: list[dict]) -> tuple[list[int], list[int], dict[str, list[dict]]]:
    """Validated versions, run seeds every strategy has, and each strategy's records in seed order."""
    strategies = [s for s in STRATEGIES if any(r["strategy"] == s for r in records)]
    seeds = sorted(set.intersection(*({r["seed"] for r in records if r["strategy"] == s} for s in strategies)))
    runs = {
        s: [next(r for r in records if r["strategy"] == s and r["seed"] == seed) for seed in seeds] for s in strategies
    }
    versions = [p["version"] for p in records[0]["curve"]]
    for run in (r for rs in runs.values() for r in rs):
        if [p["version"] for p in run["curve"]] != versions:
            raise ValueError(f"run {run['strategy']} seed {run['seed']} validated other versions than {versions}")
    return versions, seeds, runs


def summarize_learning(records: list[dict], base_score: float, target_gains: tuple[float, ...], resamples: int) -> dict:
    """Curves, gains and iteration ratios over run seeds (targets: base_score + each gain)."""
    versions, seeds, runs = _by_strategy(records)
    scores = {s: [[p["score"] for p in r["curve"]] for r in rs] for s, rs in runs.items()}
    per = {s: _strategy_figures(versions, scores[s], rs, base_score + target_gains[0]) for s, rs in runs.items()}
    targets = {}
    for i, gain in enumerate(target_gains):
        target = base_score + gain
        row = {
            "target_score": round(target, 6),
            "iterations": {s: _round(crossing(versions, mean_curve(v), target)) for s, v in scores.items()},
        }
        for slow in SLOWER:
            if slow in scores and "explore" in scores:
                row[f"{slow}_over_explore"] = paired_ratio_interval(
                    versions, scores, slow, "explore", target, resamples, seed=i
                )
        targets[f"{gain:+.2f}"] = row
    finals = {s: [v[-1] for v in vs] for s, vs in scores.items()}
    means = {s: [float(np.mean(v[1:])) for v in vs] for s, vs in scores.items()}
    differences = {
        f"explore_minus_{other}": {
            "final": paired_difference(finals, "explore", other, resamples),
            "mean_after_base": paired_difference(means, "explore", other, resamples),
        }
        for other in SLOWER
        if other in scores and "explore" in scores
    }
    return {
        "versions": versions,
        "seeds": seeds,
        "strategies": per,
        "targets": targets,
        "differences": differences,
        "exploration": _exploration_figures(runs.get("explore", [])),
    }


def _strategy_figures(versions: list[int], scores: list[list[float]], runs: list[dict], target: float) -> dict:
    gains = [v[-1] - v[0] for v in scores]
    rows = [row for r in runs for row in r["iterations"] if row["iteration"] >= 1]  # iteration 0 is random for all
    per_seed = [crossing(versions, v, target) for v in scores]
    return {
        "mean_curve": [round(float(x), 4) for x in mean_curve(scores)],
        "final_gain": {
            "mean": round(statistics.mean(gains), 4),
            "se": round(statistics.stdev(gains) / len(gains) ** 0.5, 4) if len(gains) > 1 else None,
        },
        "final_gain_per_seed": [round(g, 4) for g in gains],
        "per_seed_iterations_to_target": [_round(c) for c in per_seed],
        "reached_target": sum(c is not None for c in per_seed),
        "reward_std": _mean([row["reward_std"] for row in rows]),
        "zero_std_ratio": _mean([row["zero_std_ratio"] for row in rows]),
        "trained_variance_ratio": _mean([_variance_ratio(row) for row in rows]),
        "update_mass": _mean([row.get("update_mass") for row in rows]),
        "rollout_samples": _mean([row.get("rollout_samples") for row in rows]),
        "wall_min_per_run": _mean([r["wall_s"] / 60 for r in runs]),
    }


def _variance_ratio(row: dict) -> float | None:
    """Reward variance of the explored groups trained on over the random-seed baseline (the ledger's
    exploration_payoff.variance_ratio); None where nothing was explored."""
    explored, baseline = row.get("explored_variance"), row.get("baseline_variance")
    return None if explored is None or not baseline else explored / baseline


def _exploration_figures(runs: list[dict]) -> dict:
    rows = [row for r in runs for row in r["exploration"]]
    arms: dict[str, int] = {}
    for row in rows:
        arms[str(row["arm"])] = arms.get(str(row["arm"]), 0) + 1
    return {
        "arms_chosen": arms,
        "explored_prompts": _mean([row["explored_prompts"] for row in rows]),
        "samples_used": _mean([row["samples_used"] for row in rows]),
        "kendall_tau": _distribution([row["kendall_tau"] for row in rows]),
        "variance_gain": _distribution([row["variance_gain"] for row in rows]),
        "fallback_iterations": sum(bool(row["fallback_random"]) for row in rows),
    }


def timing_from_learning(records: list[dict]) -> dict:
    """Per strategy, seconds per iteration from its learning runs' ledgers, as a work model: the strategy's rollout
    samples per iteration times the seconds per sample of the rollout and of the update, each the median over every
    iteration after the first of every run of every strategy, plus the median sync. On a shared machine a run's
    wall seconds follow its neighbours' load; pooling the per-sample cost makes the ratio between strategies their
    ratio of work. Exploration's compute is its samples (full-sampler equivalents) times the rollout's seconds per
    sample: what the pool spends beside training. The raw median wall seconds stay in `wall_critical_s`.
    The shape of `summarize_timing`'s, so `time_to_target` reads either."""
    rows = {
        s: [
            row
            for r in records
            if r["strategy"] == s
            for row in r["iterations"]
            if row["iteration"] >= 1 and row.get("train_s") is not None and row.get("rollout_samples")
        ]
        for s in STRATEGIES
    }
    every = [row for rs in rows.values() for row in rs]
    if not every:
        return {}
    rollout_per_sample = statistics.median(row["rollout_s"] / row["rollout_samples"] for row in every)
    train_per_sample = statistics.median(row["train_s"] / _trained(row) for row in every)
    sync = statistics.median(row.get("sync_s", 0.0) for row in every)
    out = {}
    for strategy, its in rows.items():
        if not its:
            continue
        samples = statistics.median(row["rollout_samples"] for row in its)
        trained = statistics.median(_trained(row) for row in its)
        critical = sync + samples * rollout_per_sample + trained * train_per_sample
        explored = [
            e["samples_used"] or 0.0 for r in records if r["strategy"] == strategy for e in r.get("exploration", [])
        ]
        explore_s = rollout_per_sample * statistics.mean(explored) if explored else 0.0
        wall = [row.get("sync_s", 0.0) + row["rollout_s"] + row["train_s"] for row in its]
        out[strategy] = {
            "critical_s_per_iteration": round(critical, 4),
            "explore_s_per_iteration": round(explore_s, 4),
            "total_s_per_iteration": round(critical + explore_s, 4),
            "rollout_samples": samples,
            "explore_samples": round(statistics.mean(explored), 2) if explored else 0.0,
            "phases_s": {
                "sync": round(sync, 4),
                "rollout": round(samples * rollout_per_sample, 4),
                "train": round(trained * train_per_sample, 4),
            },
            "wall_critical_s": {"median": round(statistics.median(wall), 3), **_spread(wall)},
            "iterations": len(its),
            "source": "work model: samples x seconds per sample pooled over every learning run's ledger (medians)",
        }
    return out


def _trained(row: dict) -> int:
    """Samples the update trained on (records made before `trained_samples`: the rollout's, no wider draw)."""
    return row.get("trained_samples") or row["rollout_samples"]


def summarize_timing(runs: list[dict]) -> dict:
    """Per strategy: mean critical-path seconds per iteration and per phase (the pipeline's timing runs)."""
    out = {}
    for run in runs:
        rows = [row for row in run["iterations"] if row["iteration"] >= 1] or run["iterations"]  # 0: workers warm up
        phases = {name: _mean([row[f"{name}_s"] for row in rows]) for name in ("sync", "rollout", "train", "overhead")}
        out[run["strategy"]] = {
            "critical_s_per_iteration": _mean([_critical(row) for row in rows]),
            "critical_s_spread": _spread([_critical(row) for row in rows]),
            "phases_s": phases,
            "iterations": len(rows),
        }
    if "explore" in out:
        explore = out["explore"]
        explore["exploration_overhead_pct"] = round(
            100 * explore["phases_s"]["overhead"] / explore["critical_s_per_iteration"], 3
        )
    return out


def time_to_target(learning: dict, timing: dict, target_gain: float) -> dict:
    """The headline: critical-path time to the target, explore against random and against the wider draw, with the
    iterations' bootstrap interval scaled by the measured seconds-per-iteration ratio."""
    row = learning["targets"].get(f"{target_gain:+.2f}", {})
    out = {}
    for slow, name, per in (
        ("random", "time_to_target_speedup", "critical_s_per_iteration"),
        ("wider_draw", "time_to_target_speedup_vs_wider_draw", "critical_s_per_iteration"),
        ("random_wide", "time_to_target_speedup_vs_random_wide", "critical_s_per_iteration"),
        ("random", "cost_to_target_ratio", "total_s_per_iteration"),
        ("random_wide", "cost_to_target_ratio_vs_random_wide", "total_s_per_iteration"),
    ):
        ratio = row.get(f"{slow}_over_explore")
        seconds = _ratio(
            timing.get(slow, {}).get(per, timing.get(slow, {}).get("critical_s_per_iteration")),
            timing.get("explore", {}).get(per),
        )
        if ratio is None or seconds is None:
            out[name], out[f"{name}_interval"] = None, None
            continue
        out[name] = _scaled(ratio["ratio"], seconds)
        out[f"{name}_interval"] = {
            "low": _scaled(ratio["low"], seconds),
            "high": _scaled(ratio["high"], seconds),
            "unbounded": ratio["unbounded"],
            "undefined_share": ratio["undefined_share"],
            "iterations_ratio": ratio["ratio"],
            "seconds_ratio": round(seconds, 4),
        }
    return out


def per_seed_to_target(learning: dict, timing: dict) -> dict:
    """Per strategy and run seed, the headline target's crossing in iterations, critical-path seconds and total
    seconds (exploration's compute included): each seed's own curve times its strategy's seconds per iteration."""
    out = {}
    for name, figures in learning["strategies"].items():
        t = timing.get(name, {})
        critical, total = t.get("critical_s_per_iteration"), t.get("total_s_per_iteration")
        its = figures["per_seed_iterations_to_target"]
        out[name] = {
            "seeds": learning["seeds"],
            "iterations": its,
            "critical_s": [None if i is None or critical is None else round(i * critical, 1) for i in its],
            "total_s": [None if i is None or total is None else round(i * total, 1) for i in its],
        }
    return out


def _critical(row: dict) -> float:
    return row["sync_s"] + row["rollout_s"] + row["train_s"] + row["overhead_s"]


def _distribution(values: list) -> dict:
    clean = [float(v) for v in values if v is not None and v == v]
    if not clean:
        return {"n": 0, "mean": None, "p10": None, "median": None, "p90": None}
    q = np.quantile(clean, [0.1, 0.5, 0.9])
    return {
        "n": len(clean),
        "mean": round(statistics.mean(clean), 4),
        "p10": round(float(q[0]), 4),
        "median": round(float(q[1]), 4),
        "p90": round(float(q[2]), 4),
    }


def _spread(values: list[float]) -> dict:
    return {"min": round(min(values), 3), "max": round(max(values), 3)} if values else {}


def _mean(values: list) -> float | None:
    clean = [v for v in values if v is not None]
    return round(statistics.mean(clean), 6) if clean else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else round(value * factor, 4)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run_difference_note(preset: str, differences: dict[str, dict]) -> str:
    """One line saying how `spotlight run --preset` explores where the bench's explore strategy does not, with the
    flags that would measure that ("" when they agree)."""
    if not differences:
        return ""

    def shown(value) -> list[str]:
        return [f"{v:g}" if isinstance(v, float) else str(v) for v in (value if isinstance(value, tuple) else (value,))]

    def flags(flag: str, value) -> str:
        return f"no {flag}" if value is None else " ".join(f"{flag} {v}" for v in shown(value))

    said = ", ".join(
        f"{flags(d['flag'], d['run'])} (this bench: {'unset' if d['bench'] is None else ', '.join(shown(d['bench']))})"
        for d in differences.values()
    )
    return (
        f"note: `spotlight run --preset {preset}` explores otherwise: {said}; give those flags to measure what it runs"
    )


def format_exploration_report(figures: dict) -> str:
    """The headline figures as text (the CLI without --json)."""
    learning = figures["learning"]
    lines = [
        f"base held-out {figures['base_score']:.3f}, headline target {figures['target_score']:.3f} "
        f"(+{figures['target_gain']:.2f}); {figures['num_seeds']} seeds x {figures['iterations']} iterations; "
        f"exploration budget {figures['explore_samples']:g} samples per iteration",
        *filter(None, [run_difference_note(figures["preset"], figures.get("explore_differs_from_run", {}))]),
        f"{'strategy':>10} {'final gain (SE)':>16} {'reached':>7} {'mean curve at ' + str(learning['versions']):<40}",
    ]
    for name, s in learning["strategies"].items():
        gain = s["final_gain"]
        lines.append(
            f"{name:>10} {gain['mean']:+.3f} ({_fmt(gain['se'])}){'':>3} {s['reached_target']:>7} "
            f"{', '.join(f'{x:.3f}' for x in s['mean_curve'])}"
        )
    for gain, row in learning["targets"].items():
        its = ", ".join(f"{s} {_fmt(v)}" for s, v in row["iterations"].items())
        ratios = "; ".join(
            f"{k.replace('_over_', '/')} {_fmt(r['ratio'])} [{_fmt(r['low'])}, "
            f"{'inf' if r['unbounded'] else _fmt(r['high'])}]"
            for k, r in row.items()
            if k.endswith("_over_explore")
        )
        lines.append(f"target {gain}: iterations {its}; {ratios}")
    for name, t in figures["timing"].items():
        lines.append(
            f"{name:>10} critical {t['critical_s_per_iteration']:.2f} s/iteration, total "
            f"{_fmt(t.get('total_s_per_iteration'))}, phases {t['phases_s']}"
        )
    for key in (
        "time_to_target_speedup",
        "time_to_target_speedup_vs_wider_draw",
        "time_to_target_speedup_vs_random_wide",
        "cost_to_target_ratio",
        "cost_to_target_ratio_vs_random_wide",
    ):
        if figures.get(key) is not None:
            lines.append(f"{key}: {figures[key]} {figures[f'{key}_interval']}")
    for key, value in learning["differences"].items():
        lines.append(f"{key}: {value}")
    lines.append(f"exploration: {learning['exploration']}")
    for level, f in figures["static"]["levels"].items():
        lines.append(f"static {level}: {f}")
    return "\n".join(lines)


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)
