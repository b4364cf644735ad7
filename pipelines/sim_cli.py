"""`spotlight simulate` and `spotlight plan`: cost at scale on simulated time (workers/sim, docs/SIMULATOR.md).

Only typer at import time; the simulator (SimPy, DuckDB) is imported after the arguments are checked.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

POLICY_NAMES = ("roll", "naive_spot", "rlboost", "spotlight")


def _ints(text: str, what: str, least: int = 1) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"{what} must be comma-separated integers such as 8,16,32,64, got {text!r}") from None
    if not values or min(values) < least:
        raise typer.BadParameter(f"{what} must list integers >= {least}, got {text!r}")
    return values


def _inputs(
    model, resolution, market, prices, curve, policies, iterations, explore_speedup, seeds, keep_factor=1.0, target=None
):
    """Parse every input before any simulation runs; a bad one is a one-line error."""
    from resources.prices import load_prices
    from workers.sim.config import POLICIES, SimConfig
    from workers.sim.inputs import model_preset
    from workers.sim.market import parse_market

    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in POLICIES]
    if unknown or not names:
        raise ValueError(f"--policies: unknown {unknown}; choose from {', '.join(POLICY_NAMES)}")
    if prices is not None and not prices.is_file():
        raise ValueError(f"--prices {prices}: no such file (YAML format in resources/prices.py)")
    times = model_preset(model, resolution=resolution)
    table = load_prices(prices)
    table.price(times.gpu_type)
    learning, measured = _curve(curve, target)
    if explore_speedup is None:
        explore_speedup = measured or 1.0
    elif curve is not None and explore_speedup != measured:  # the report names the speed-up the runs used
        learning = replace(
            learning, source=f"{learning.source}; explore speedup {explore_speedup:g} used, from --explore-speedup"
        )
    base = SimConfig(
        POLICIES["spotlight"], iterations=iterations, explore_speedup=explore_speedup, keep_factor=keep_factor
    )
    return base, times, parse_market(market), table, learning, names, _ints(seeds, "--seeds", least=0)


def _curve(path, target=None):
    """The learning curve and, from an exploration bench record, its explore speedup measured at the simulated
    `target` where the bench has that target, else at its headline (else None)."""
    from workers.sim.inputs import LearningCurve, curve_from_bench, default_curve

    if path is None:
        return default_curve(), None
    if path.suffix == ".json":
        return curve_from_bench(path, target=target)
    return LearningCurve.from_ledger(path), None


def simulate_command(
    model: str = typer.Option("qwen-image-20b", help="Service-time preset (workers/sim/inputs.py)."),
    spot_gpus: str = typer.Option("8,16,32,64", help="Comma-separated spot (rollout) GPU counts."),
    market: str = typer.Option(
        "10-15%", help="AWS band (<5%, 5-10%, 10-15%, 15-20%, >20%), none, renewal:MEAN_H[:SHAPE] or a CSV."
    ),
    prices: Optional[Path] = typer.Option(None, help="Prices YAML over the default table (resources/prices.py)."),
    policies: str = typer.Option(",".join(POLICY_NAMES), help="Comma-separated: roll, naive_spot, rlboost, spotlight."),
    iterations: int = typer.Option(100, min=1),
    resolution: int = typer.Option(512, help="512 or 1280."),
    target: float = typer.Option(0.40, help="Validation target on the learning curve."),
    curve: Optional[Path] = typer.Option(
        None,
        help="The learning curve: a real run's ledger (its validation table), or a "
        "`spotlight bench exploration --json` record (random seeds' mean curve).",
    ),
    explore_speedup: Optional[float] = typer.Option(
        None,
        help="Progress of an iteration on explored seeds, in iterations on random seeds (default: with such a "
        "--curve, the bench record's ratio measured at --target's gain over its base where it has that target, "
        "else at its headline target; else 1: no gain).",
    ),
    keep_factor: float = typer.Option(
        1.0,
        help="Rollout seeds per explored prompt as a multiple of the group size (W/G): a pre-filter's wider "
        "rollout on the critical path (the exploration bench's --keep-factor; 1: none).",
    ),
    seeds: str = typer.Option("0", help="Comma-separated simulation seeds (market and gains); rows per seed."),
    out: Optional[Path] = typer.Option(None, help="Folder for each run's ledger, table.md and simulate.png."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object per simulated run, then a summary line."),
) -> None:
    """Simulate training runs under each policy and spot-GPU count: cost, time to target, utilisation, throughput."""
    try:
        counts = _ints(spot_gpus, "--spot-gpus")
        base, times, mk, table, lc, names, seed_list = _inputs(
            model, resolution, market, prices, curve, policies, iterations, explore_speedup, seeds, keep_factor, target
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    from workers.sim.calibration import calibration_line, load_calibration
    from workers.sim.report import PAPER_CLAIMS, plot, sweep
    from workers.sim.report import table as md_table
    from workers.sim.summary import against_paper, summary_markdown

    started = time.perf_counter()
    rows = sweep(
        base, times, mk, lc, spot_gpus=counts, policies=names, target=target, prices=table, out_dir=out, seeds=seed_list
    )
    elapsed = time.perf_counter() - started
    summary = summary_markdown(rows)
    if out is not None:
        (out / "table.md").write_text(f"{summary}\n\nEvery run:\n\n{md_table(rows)}\n\n{PAPER_CLAIMS}\n")
        plot(rows, out / "simulate.png")
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row, sort_keys=True, default=str))
        typer.echo(
            json.dumps(
                {
                    "summary": True,
                    "runs": len(rows),
                    "wall_s": round(elapsed, 2),
                    "market": mk.name,
                    "curve": lc.source,
                    "explore_speedup": base.explore_speedup,
                    "keep_factor": base.keep_factor,
                    "model": times.model,
                    "iterations": iterations,
                    "run_wall_s": [round(r["sim_wall_s"], 2) for r in rows],
                    "against_paper": against_paper(rows),
                    "calibration": load_calibration(),
                },
                sort_keys=True,
                default=str,
            )
        )
        return
    typer.echo(md_table(rows) if len(seed_list) == 1 else summary)
    typer.echo(f"\nmarket: {mk.name}; curve: {lc.source}\n{PAPER_CLAIMS}\n{len(rows)} runs in {elapsed:.1f} s")
    typer.echo(f"\n{calibration_line(load_calibration())}")


def plan_command(
    budget: float = typer.Option(..., help="Most dollars to spend reaching the target."),
    deadline_h: float = typer.Option(..., help="Hours by which the target must be reached."),
    model: str = typer.Option("qwen-image-20b"),
    spot_gpus: str = typer.Option("8,16,32,64", help="Candidate rollout GPU counts."),
    market: str = typer.Option("10-15%"),
    prices: Optional[Path] = typer.Option(None),
    policies: str = typer.Option(",".join(POLICY_NAMES)),
    iterations: int = typer.Option(100, min=1),
    resolution: int = typer.Option(512),
    target: float = typer.Option(0.40),
    curve: Optional[Path] = typer.Option(None),
    explore_speedup: Optional[float] = typer.Option(None),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """What-if: the cheapest policy and spot-GPU count that reaches the target by the deadline within the budget."""
    if not budget > 0 or not deadline_h > 0:
        raise typer.BadParameter(f"--budget and --deadline-h must be > 0, got {budget}, {deadline_h}")
    try:
        counts = _ints(spot_gpus, "--spot-gpus")
        base, times, mk, table, lc, names, _ = _inputs(
            model, resolution, market, prices, curve, policies, iterations, explore_speedup, "0", target=target
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    from workers.sim.report import plan, sweep

    rows = sweep(base, times, mk, lc, spot_gpus=counts, policies=names, target=target, prices=table)
    best = plan(rows, budget_usd=budget, deadline_h=deadline_h)
    record = {
        "feasible": best is not None,
        "best": best,
        "candidates": len(rows),
        "target": target,
        "budget_usd": budget,
        "deadline_h": deadline_h,
    }
    if as_json:
        typer.echo(json.dumps(record, sort_keys=True, default=str))
    elif best is None:
        typer.echo(
            f"no configuration of {len(rows)} reaches {target} within {deadline_h} h and ${budget}; "
            "raise the budget or deadline, or add --spot-gpus counts"
        )
        raise typer.Exit(1)
    else:
        typer.echo(
            f"cheapest: {best['policy']} on {best['spot_gpus']} spot GPUs: target {target} in "
            f"{best['hours_to_target']:.2f} h for ${best['usd_to_target']:.1f} (run total ${best['usd_total']:.1f})"
        )


def simulate_calibrate_command(
    ledger: Path = typer.Option(..., help="A real `spotlight run`'s ledger.duckdb (make demo writes runs/demo)."),
    note: Optional[str] = typer.Option(None, help="How the real run was made (its command, the machine's load)."),
    out: Optional[Path] = typer.Option(None, help="Where to write the record (default: the one simulate prints)."),
) -> None:
    """Replay a real run in the simulator and record the agreement that `spotlight simulate` prints."""
    if not ledger.is_file():
        raise typer.BadParameter(f"--ledger {ledger}: no such file (a run folder's ledger.duckdb)")
    from workers.sim.calibration import calibrate, calibration_line, write_calibration

    try:
        record = calibrate(ledger, {"note": note, "commit": _commit()})
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    path = write_calibration(record, out)
    typer.echo(f"{calibration_line(record)}\nwritten to {path}")


def _commit() -> Optional[str]:
    """The checkout's short commit (None outside a git checkout)."""
    import subprocess

    here = Path(__file__).parent
    cmd = ["git", "rev-parse", "--short", "HEAD"]
    done = subprocess.run(cmd, cwd=here, capture_output=True, text=True, check=False)
    return (done.stdout.strip() or None) if done.returncode == 0 else None
