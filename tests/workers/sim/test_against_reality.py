"""The simulator checked against a real `spotlight run`: same service times, workers and preemption trace,
same ledger figures.

One real run (module fixture, about 45 s on the 2 shared cores): `cpu_tiny` for 2 iterations
on the tiny test policy, two worker processes preempted at 240 per worker-hour, every
preemption with its 2 s notice. Its rollout phases are about half of each iteration, so a
wrong rollout service time shows in every compared figure (cpu_smoke's rollouts are under
10 % of an iteration: a 2x error there hid within 15 %). With notice, a preempted worker hands
its request back at once; a SIGKILL's request waits out its 10 s lease, and a rollout phase
that ends on a lease expiry does not depend on the step time, so with SIGKILLs in the trace
the 2x check below had nothing to detect in some runs (docs/SIMULATOR.md, "Checked against a
real run").
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.nightly  # a real preempted run first, about 2 min: make test-all


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """The ledger of a real run with preemptions, rollouts pulled by two worker processes."""
    return run_for_real(tmp_path_factory.mktemp("reality"))


def run_for_real(root: Path, *extra: str) -> Path:
    """`spotlight run` of cpu_tiny, 2 iterations, under preemptions that all come with notice; its ledger."""
    from workers.model.tiny_policy import PolicyConfig, build_policy, save_policy

    config = PolicyConfig(image_size=16, num_layers=1, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
    save_policy(build_policy(config, seed=0).eval(), root / "tiny")  # the tiny_policy fixture's policy
    cmd = [
        str(Path(sys.executable).parent / "spotlight"),
        "run",
        "--run-dir",
        str(root / "real"),
        "--preset",
        "cpu_tiny",
        "--iterations",
        "2",
        "--checkpoint",
        str(root / "tiny"),
        "--preemptions-per-hour",
        "240",
        "--notice-share",
        "1",
        *extra,
    ]
    done = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr
    from resources.ledger.db import query_ledger

    ledger = root / "real" / "ledger.duckdb"
    notices = [n for (n,) in query_ledger(ledger, "SELECT notice_s FROM preemptions").rows]
    assert notices and min(notices) > 0, f"--notice-share 1 gave preemptions without notice: {notices}"
    return ledger


def replayed(real: Path, out: Path, slower_steps: float = 1.0) -> tuple[dict, list]:
    """The real run replayed in the simulator (rollout step times scaled by `slower_steps`): errors,
    per-iteration rows."""
    from workers.sim.engine import simulate
    from workers.sim.measure import compare, per_iteration, replay_inputs

    replay = replay_inputs(real)
    iterations = [
        dataclasses.replace(i, step_s=None if i.step_s is None else i.step_s * slower_steps)
        for i in replay.setup.iterations
    ]
    times = dataclasses.replace(replay.times, step_s=replay.times.step_s * slower_steps)
    result = simulate(
        replay.config,
        times,
        replay.market,
        replay.curve,
        setup=dataclasses.replace(replay.setup, iterations=iterations),
        out_dir=out,
    )
    return compare(real, result.ledger_path), list(
        zip(per_iteration(real), per_iteration(result.ledger_path), strict=False)
    )


def test_simulated_run_matches_a_real_run_with_preemptions_within_15_percent(real_run, tmp_path):
    from workers.sim.measure import COMPARED

    errors, detail = replayed(real_run, tmp_path)
    assert sum(r["preemptions"] for r, _ in detail) >= 1, "the real run saw no preemption: nothing was checked"
    assert all(r["rollout_s"] > 0 for r, _ in detail[:-1])
    assert all(errors[name] <= 0.15 for name in COMPARED), (errors, detail)
    assert rollout_error(detail) <= 0.15, detail
    # The trace was replayed: every real preemption happened in the simulated run too (same slots, same times).
    assert sum(r["preemptions"] for r, _ in detail) == sum(s["preemptions"] for _, s in detail), detail


@pytest.mark.parametrize("slower_steps", [2.0, 0.5])
def test_the_reality_check_fails_when_the_rollout_step_time_is_off_by_2x(real_run, tmp_path, slower_steps):
    from workers.sim.measure import COMPARED

    errors, detail = replayed(real_run, tmp_path, slower_steps=slower_steps)
    # Where the rollout is a small share of an iteration (an idle machine), a wrong step time may move the
    # iteration's totals by less than 15 %; the rollout phase itself is then off, which the check also compares.
    assert max(max(errors[name] for name in COMPARED), rollout_error(detail)) > 0.15, (errors, detail)


def test_a_run_of_batched_requests_replays_its_samples_work(tmp_path_factory, tmp_path):
    """`make demo`'s rollout requests sample a prompt's seeds in one batch (`seeds_per_request`): the replay reads
    each batched attempt as its samples, so the simulated rollout phases do the real run's work (before, they ran on
    a made-up 0.01 s step: 87 % off on make demo's ledger)."""
    from workers.sim.measure import replay_inputs

    root = tmp_path_factory.mktemp("batched")
    (root / "batched.yaml").write_text("sampling:\n  seeds_per_request: 4\n")
    real = run_for_real(root, "--config", str(root / "batched.yaml"))
    replay = replay_inputs(real)
    assert replay.times.num_steps == 8 and replay.config.group_size == 8  # cpu_tiny's sampler and group
    errors, detail = replayed(real, tmp_path)
    real_s, sim_s = (sum(row["rollout_s"] for row in rows) for rows in zip(*detail, strict=True))
    assert abs(sim_s - real_s) / real_s <= 0.15, (real_s, sim_s, detail)  # measured: 2.3 s real, 2.3 s simulated
    assert errors["wall_s"] <= 0.15, (errors, detail)  # measured: 1.2 %
    _, slow = replayed(real, tmp_path / "slow", slower_steps=2.0)
    assert rollout_error(slow) > 0.15, slow  # and a wrong step time shows (measured: 67 %)


def rollout_error(detail: list) -> float:
    """Mean relative error of the simulated rollout phase's seconds, over the iterations that rolled out."""
    pairs = [(r["rollout_s"], s["rollout_s"]) for r, s in detail if r["rollout_s"] > 0]
    return sum(abs(sim - real) / real for real, sim in pairs) / max(len(pairs), 1)


def test_simulate_calibrate_records_the_agreement_that_simulate_prints(real_run, tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from pipelines.cli import app
    from workers.sim import calibration

    record_path = tmp_path / "calibration.json"
    done = CliRunner().invoke(
        app, ["simulate-calibrate", "--ledger", str(real_run), "--note", "the test's run", "--out", str(record_path)]
    )
    assert done.exit_code == 0, done.output
    record = json.loads(record_path.read_text())
    errors, detail = replayed(real_run, tmp_path / "again")
    assert record["errors"]["wall_s"] == pytest.approx(errors["wall_s"], abs=1e-3)
    assert record["real"]["preemptions"] == sum(r["preemptions"] for r, _ in detail) >= 1
    assert record["step_time_2x_errors"]["rollout_s"] > record["errors"]["rollout_s"]  # it can see a wrong step time
    assert record["source"]["run"]["preset"] == "cpu_tiny" and record["source"]["note"] == "the test's run"
    # `spotlight simulate` prints that record, without simulating the real run again.
    monkeypatch.setattr(calibration, "CALIBRATION_FILE", record_path)
    args = ["simulate", "--spot-gpus", "2", "--policies", "spotlight", "--iterations", "2", "--market", "none"]
    printed = " ".join(CliRunner().invoke(app, args).output.split())
    assert "calibration: replaying a real local run (the test's run: 2 iterations, 2 workers" in printed
    assert f"preemptions {record['real']['preemptions']:g} real, {record['simulated']['preemptions']:g} simulated" in (
        printed
    )
