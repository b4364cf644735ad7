"""`spotlight run`: refusals before compute, and a killed run resumed to the same ledger as an uninterrupted one."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]

# Everything in the ledger except clocks: a resumed run must match an uninterrupted one on these.
CONTENT_QUERIES = {
    "runs": "SELECT run_id, status, preset FROM runs",
    "iterations": "SELECT iteration, weights_version, status FROM iterations ORDER BY 1",
    "phases": "SELECT iteration, phase FROM phases ORDER BY 1, 2",
    "requests": "SELECT request_id, iteration, seed, weights_version, attempts, status, result_hash, reward FROM requests ORDER BY 1",
    "train_steps": "SELECT iteration, step, loss, reward_mean, zero_std_ratio, grad_norm FROM train_steps ORDER BY 1, 2",
    "validation": "SELECT iteration, weights_version, score, num_prompts FROM validation ORDER BY 1",
    "validation_scores": "SELECT * FROM validation_scores ORDER BY 1, 2",
    "syncs": "SELECT version, kind, dense_bytes, patch_bytes, weights_hash FROM syncs ORDER BY 1, 2",
    "workers": "SELECT worker_id, role, spot, end_reason FROM workers ORDER BY 1",
}


def _invoke(*args: str):
    from pipelines.cli import app

    return CliRunner().invoke(app, ["run", *args])


def test_run_refuses_a_folder_that_holds_a_run_unless_resumed(tmp_path):
    (tmp_path / "run.json").write_text('{"run_dir": "x"}')
    result = _invoke("--run-dir", str(tmp_path), "--preset", "cpu_smoke")
    assert result.exit_code != 0 and "--resume" in result.output


def test_resume_refuses_flags_that_differ_from_the_stored_run(tmp_path):
    from pipelines.run import RunSpec

    RunSpec(str(tmp_path), preset="cpu_smoke", iterations=2).save()
    result = _invoke("--run-dir", str(tmp_path), "--resume", "--iterations", "5")
    assert result.exit_code != 0 and "--iterations 5" in result.output


@pytest.mark.parametrize("flag, value, message", [
    ("--preset", "huge", "unknown preset"), ("--store", "ftp://h/x", "store URL scheme"),
    ("--queue", "amqp://h", "queue URL scheme"), ("--rollouts", "magic", "--rollouts"),
])
def test_bad_flags_fail_before_any_compute(tmp_path, flag, value, message):
    result = _invoke("--run-dir", str(tmp_path / "r"), flag, value)
    assert result.exit_code != 0 and message in result.output
    assert not (tmp_path / "r" / "ledger.duckdb").exists()


def _spotlight_run(run_dir: Path, checkpoint: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(Path(sys.executable).parent / "spotlight"), "run", "--run-dir", str(run_dir), *extra]
    if "--resume" not in extra:
        cmd += ["--preset", "cpu_smoke", "--iterations", "2", "--checkpoint", str(checkpoint)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _content(run_dir: Path) -> dict:
    from resources.ledger_db import query_ledger

    return {name: query_ledger(run_dir / "ledger.duckdb", sql).rows for name, sql in CONTENT_QUERIES.items()}


@pytest.mark.slow
def test_killed_run_resumes_to_the_ledger_of_an_uninterrupted_run(tmp_path, tiny_policy):
    from workers.policy import save_policy

    save_policy(tiny_policy, tmp_path / "tiny")
    # Both runs are named "r" (the folder's name), so request ids and store keys match.
    whole, killed = tmp_path / "a" / "r", tmp_path / "b" / "r"
    proc = _spotlight_run(killed, tmp_path / "tiny")
    mid_iteration_1 = killed / "store" / "runs" / "r" / "rollouts" / "it-000001"
    deadline = time.monotonic() + 600
    while not (mid_iteration_1.is_dir() and any(mid_iteration_1.iterdir())):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "iteration 1 never started"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _content(killed)["iterations"][-1][2] == "running"  # it died mid-iteration

    resumed = _spotlight_run(killed, tmp_path / "tiny", "--resume")
    assert resumed.wait(timeout=900) == 0, resumed.stderr.read()
    fresh = _spotlight_run(whole, tmp_path / "tiny")
    assert fresh.wait(timeout=900) == 0, fresh.stderr.read()

    got, expected = _content(killed), _content(whole)
    assert [r[:3] for r in got["iterations"]] == [(0, 0, "succeeded"), (1, 1, "succeeded"), (2, 2, "succeeded")]
    for table in CONTENT_QUERIES:
        assert got[table] == expected[table], table
    assert (killed / "report" / "index.html").is_file()
