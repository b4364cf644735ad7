"""The simulator checked against a real `spotlight run`: same service times, workers and preemption trace, same ledger figures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
@pytest.mark.xfail(strict=False, reason="known failing (issue 21 open): under load the critical path differed by "
                   "13-28 % per iteration and the preemption totals by one event; see docs/SIMULATOR.md")
def test_simulated_run_matches_a_real_run_with_preemptions_within_15_percent(tmp_path, tiny_policy):
    from workers.model.policy import save_policy
    from workers.sim.engine import simulate
    from workers.sim.measure import COMPARED, compare, per_iteration, replay_inputs

    save_policy(tiny_policy, tmp_path / "tiny")
    run = tmp_path / "real"
    cmd = [str(Path(sys.executable).parent / "spotlight"), "run", "--run-dir", str(run), "--preset", "cpu_smoke",
           "--iterations", "2", "--checkpoint", str(tmp_path / "tiny"), "--preemptions-per-hour", "240"]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    real = run / "ledger.duckdb"

    replay = replay_inputs(real)
    result = simulate(replay.config, replay.times, replay.market, replay.curve, setup=replay.setup, out_dir=tmp_path / "sim")
    errors = compare(real, result.ledger_path)
    detail = list(zip(per_iteration(real), per_iteration(result.ledger_path)))
    assert set(errors) == set(COMPARED)
    assert all(e <= 0.15 for e in errors.values()), (errors, detail)
    # The trace was replayed: every real preemption happened in the simulated run too (same slots, same times).
    assert sum(r["preemptions"] for r, _ in detail) == sum(s["preemptions"] for _, s in detail)
