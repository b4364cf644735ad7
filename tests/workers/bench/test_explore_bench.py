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
    records = sorted(p.name for p in (tmp_path / "records").iterdir())  # each learning run's record is kept
    assert records == ["explore-s0.json", "random-s0.json", "wider_draw-s0.json"]


def test_a_learning_run_reuses_its_record_and_redoes_a_stale_one(tmp_path, tiny_policy) -> None:
    import dataclasses

    from workers.bench.exploration_learning import LearningRun, learning_run
    from workers.explore.state import ExploreConfig
    from workers.model.policy import save_policy
    from workers.trainer.presets import get_preset

    save_policy(tiny_policy, tmp_path / "tiny")
    config = dataclasses.replace(get_preset("cpu_smoke"), iterations=1)
    spec = LearningRun("explore", 0, config, ExploreConfig(cache_levels=("half_steps",)), 16.0, str(tmp_path / "tiny"))
    (tmp_path / "out").mkdir()
    kept = {"fingerprint": spec.fingerprint(), "curve": "kept as written"}
    (tmp_path / "out" / "explore-s0.json").write_text(json.dumps(kept))
    assert learning_run(spec, tmp_path / "out") == kept  # this run's record: nothing is trained again
    other = dataclasses.replace(spec, explore_samples=9.0)  # another budget: the record is stale
    record = learning_run(other, tmp_path / "out")
    assert record["fingerprint"] == other.fingerprint() != spec.fingerprint()
    assert [p["version"] for p in record["curve"]] == [0, 1] and record["exploration"][0]["arm"] == "m8-half_steps"
    assert json.loads((tmp_path / "out" / "explore-s0.json").read_text()) == record


def test_bad_bench_settings_fail_before_any_compute() -> None:
    spotlight = str(Path(sys.executable).parent / "spotlight")
    out = subprocess.run([spotlight, "bench", "exploration", "--seed", "1", "--seed", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "seeds must be distinct" in out.stderr
    out = subprocess.run([spotlight, "bench", "exploration", "--explore-samples", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "explore_samples must be > 0" in out.stderr
