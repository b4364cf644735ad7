"""`spotlight bench exploration`: the quick mode runs every part and names its figures plainly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


@pytest.mark.slow
def test_quick_bench_compares_the_three_strategies_and_reports_the_headline_figures() -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([str(Path(sys.executable).parent / "spotlight"), "bench", "exploration", "--quick", "--json"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout)
    assert set(figures["strategies"]) == {"random", "explore", "best_of_n"}
    for strategy in figures["strategies"].values():
        assert {"reached_target", "iterations_to_target", "critical_s_to_target", "reward_std", "zero_std_ratio"} <= set(strategy)
    for key in ("time_to_target_speedup", "exploration_overhead_pct", "kendall_tau", "spearman_rho", "kendall_tau_audit",
                "variance_gain", "arms_chosen", "static"):
        assert key in figures, key
    explore_runs = [r for r in figures["runs"] if r["strategy"] == "explore"]
    assert explore_runs and all(row["planner"] for r in explore_runs for row in r["iterations"])
    assert explore_runs[0]["iterations"][1]["planner"].startswith(("explore:", "random:"))
    assert 0 <= figures["exploration_overhead_pct"] < 100 and figures["kendall_tau"]["n"] >= 1
    assert set(figures["static"]["levels"]) == {"fbcache", "half_steps", "quarter_steps"}


def test_bad_bench_settings_fail_before_any_compute() -> None:
    out = subprocess.run([str(Path(sys.executable).parent / "spotlight"), "bench", "exploration", "--seed", "1", "--seed", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "seeds must be distinct" in out.stderr
