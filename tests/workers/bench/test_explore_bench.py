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
def test_quick_bench_compares_the_three_strategies_and_reports_the_headline_figures(tmp_path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [str(Path(sys.executable).parent / "spotlight"), "bench", "exploration", "--quick", "--json",
               "--out", str(tmp_path / "records"), "--jobs", "2"]
    out = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    figures = json.loads(out.stdout)
    learning = figures["learning"]
    assert set(learning["strategies"]) == {"random", "explore", "wider_draw"}
    for strategy in learning["strategies"].values():
        assert len(strategy["mean_curve"]) == len(learning["versions"]) == 3  # versions 0, 1, 2
        assert {"final_gain", "reached_target", "per_seed_iterations_to_target", "reward_std"} <= set(strategy)
    assert {"random_over_explore", "wider_draw_over_explore"} <= set(learning["targets"]["+0.08"])
    for key in ("time_to_target_speedup", "time_to_target_speedup_interval", "timing", "static"):
        assert key in figures, key
    assert learning["exploration"]["arms_chosen"] and learning["exploration"]["samples_used"] <= 16
    assert set(figures["timing"]) == {"random", "explore", "wider_draw"}
    assert 0 <= figures["timing"]["explore"]["exploration_overhead_pct"] < 100
    assert set(figures["static"]["levels"]) == {"fbcache", "half_steps", "quarter_steps"}
    # Each learning run's record is kept, and a second run of the bench reuses it instead of training again.
    records = sorted(p.name for p in (tmp_path / "records").iterdir())
    assert records == ["explore-s0.json", "random-s0.json", "wider_draw-s0.json"]
    again = subprocess.run(command + ["--timing-iterations", "0"], cwd=tmp_path, env=env, capture_output=True,
                           text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["learning_runs"] == figures["learning_runs"]


def test_bad_bench_settings_fail_before_any_compute() -> None:
    spotlight = str(Path(sys.executable).parent / "spotlight")
    out = subprocess.run([spotlight, "bench", "exploration", "--seed", "1", "--seed", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "seeds must be distinct" in out.stderr
    out = subprocess.run([spotlight, "bench", "exploration", "--explore-samples", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "explore_samples must be > 0" in out.stderr
