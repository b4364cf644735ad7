"""The simulator's own calibration: how closely it replays a recorded real local run, printed by `spotlight simulate`.

`calibrate` replays a real `spotlight run`'s ledger in the simulator (workers/sim/measure.py: the run's service times,
workers and preemption trace go in; the rollout phases, worker lifetimes, preemptions, time and cost come out) and
measures the agreement per iteration, the same comparison tests/workers/sim/test_against_reality.py asserts. It also
replays the run with every rollout step twice as long, to show what an error the check would see. `spotlight
simulate-calibrate --ledger RUN/ledger.duckdb` writes the result to `CALIBRATION_FILE` with where the run came from;
`spotlight simulate` reads that file (no simulation of its own) and prints `calibration_line`.

Example:
    record = calibrate(Path("runs/demo/ledger.duckdb"), {"run": "make demo, seed 0"})
    write_calibration(record)
    print(calibration_line(load_calibration()))
"""

from __future__ import annotations

import dataclasses
import json
import platform
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from resources.ledger.db import query_ledger
from workers.sim.measure import compare, per_iteration, replay_inputs

CALIBRATION_FILE = Path(__file__).with_name("calibration.json")
"""The recorded calibration `spotlight simulate` prints (refreshed by `spotlight simulate-calibrate`)."""
REFRESH = "spotlight simulate-calibrate --ledger RUN_DIR/ledger.duckdb"
"""How to refresh it from a real run (any `spotlight run` on local workers; `make demo` writes runs/demo)."""
FIGURES = ("wall_s", "critical_path_s", "usd_total", "rollout_s", "preemptions")
"""What is compared, per iteration: the COMPARED figures of workers/sim/measure.py and the rollout phase."""


def _replay(ledger: Path, out: Path, slower_steps: float = 1.0) -> Path:
    """The simulated ledger of `ledger`'s run replayed (rollout step times scaled by `slower_steps`)."""
    from workers.sim.engine import simulate

    replay = replay_inputs(ledger)
    iterations = [
        dataclasses.replace(i, step_s=None if i.step_s is None else i.step_s * slower_steps)
        for i in replay.setup.iterations
    ]
    times = dataclasses.replace(replay.times, step_s=replay.times.step_s * slower_steps)
    setup = dataclasses.replace(replay.setup, iterations=iterations)
    return simulate(replay.config, times, replay.market, replay.curve, setup=setup, out_dir=out).ledger_path


def _run_shape(ledger: Path) -> dict:
    """What the real run was: preset, iterations, rollout workers (slots), rollout requests, step time."""
    preset = query_ledger(ledger, "SELECT preset FROM runs").rows
    workers = query_ledger(ledger, "SELECT worker_id FROM workers WHERE role = 'rollout'").rows
    slots = {w.split(".")[0] for (w,) in workers}
    requests = query_ledger(ledger, "SELECT count(*) FROM requests WHERE kind = 'rollout'").rows[0][0]
    return {
        "preset": preset[0][0] if preset else None,
        "iterations": int(query_ledger(ledger, "SELECT max(iteration) FROM iterations").rows[0][0] or 0),
        "workers": len(slots),
        "rollout_requests": int(requests),
        "step_s": replay_inputs(ledger).times.step_s,
    }


def calibrate(ledger: Path, source: dict) -> dict:
    """The agreement of the simulator with the real run of `ledger`: mean relative error per iteration of each of
    FIGURES, the run's totals real and simulated, and the errors of a replay with a rollout step time 2x off."""
    ledger = Path(ledger)
    with tempfile.TemporaryDirectory() as tmp:
        simulated = _replay(ledger, Path(tmp) / "same")
        errors = compare(ledger, simulated)
        real_rows, sim_rows = per_iteration(ledger), per_iteration(simulated)
        off = compare(ledger, _replay(ledger, Path(tmp) / "slower", slower_steps=2.0))
    return {
        "source": {**source, "ledger": str(ledger), "run": _run_shape(ledger)},
        "recorded_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "errors": {name: round(errors[name], 4) for name in FIGURES},
        "real": {name: round(sum(r[name] for r in real_rows), 6) for name in FIGURES},
        "simulated": {name: round(sum(r[name] for r in sim_rows), 6) for name in FIGURES},
        "step_time_2x_errors": {name: round(off[name], 4) for name in FIGURES},
        "refresh": REFRESH,
    }


def machine() -> str:
    """This machine in words: CPU model and core count (where the real run and its calibration ran)."""
    import os

    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        model = names[0] if names else model
    return f"{os.cpu_count()}-vCPU {model}"


def write_calibration(record: dict, path: Path | None = None) -> Path:
    path = path or CALIBRATION_FILE
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def load_calibration(path: Path | None = None) -> dict | None:
    """The recorded calibration (`CALIBRATION_FILE` unless `path`), or None where none was recorded (the line then
    says how to record one)."""
    path = path or CALIBRATION_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def calibration_line(record: dict | None) -> str:
    """One paragraph for `spotlight simulate`'s output: the simulator against the recorded real run."""
    if record is None:
        return f"calibration: none recorded; record one from a real local run with `{REFRESH}`"
    e, real, sim, off = record["errors"], record["real"], record["simulated"], record["step_time_2x_errors"]
    src, run = record["source"], record["source"]["run"]
    what = src.get("note") or f"spotlight run --preset {run['preset']}"
    pct = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    return (
        f"calibration: replaying a real local run ({what}: {run['iterations']} iterations, {run['workers']} "
        f"workers, {run['rollout_requests']} rollout requests, rollout step {run['step_s']:.3f} s; "
        f"{record['machine']}, commit {src.get('commit') or 'unknown'}, recorded {record['recorded_at']}), the "
        f"simulator is off per iteration by: wall {pct(e['wall_s'])}, critical path {pct(e['critical_path_s'])}, "
        f"cost {pct(e['usd_total'])}, rollout phases {pct(e['rollout_s'])} (rollout {real['rollout_s']:.1f} s "
        f"real, {sim['rollout_s']:.1f} s simulated); preemptions {real['preemptions']:g} real, "
        f"{sim['preemptions']:g} simulated. A rollout step time 2x off would read: wall {pct(off['wall_s'])}, "
        f"rollout phases {pct(off['rollout_s'])}. Refresh: {record['refresh']}"
    )
