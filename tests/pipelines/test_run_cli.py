"""`spotlight run`: refusals before compute, and a killed run resumed to the same ledger as an uninterrupted one."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.paths import REPO_ROOT

ROOT = REPO_ROOT

# Everything in the ledger except clocks: a resumed run must match an uninterrupted one on these.
CONTENT_QUERIES = {
    "runs": "SELECT run_id, status, preset FROM runs",
    "iterations": "SELECT iteration, weights_version, status FROM iterations ORDER BY 1",
    "phases": "SELECT iteration, phase FROM phases ORDER BY 1, 2",
    "requests": "SELECT request_id, iteration, seed, weights_version, attempts, status, result_hash, reward "
    "FROM requests ORDER BY 1",
    "train_steps": "SELECT iteration, step, loss, reward_mean, zero_std_ratio, grad_norm "
    "FROM train_steps ORDER BY 1, 2",
    "validation": "SELECT iteration, weights_version, score, num_prompts FROM validation ORDER BY 1",
    "validation_scores": "SELECT * FROM validation_scores ORDER BY 1, 2",
    "syncs": "SELECT version, kind, dense_bytes, patch_bytes, weights_hash FROM syncs ORDER BY 1, 2",
    "workers": "SELECT worker_id, role, spot, end_reason FROM workers ORDER BY 1",
}


def _invoke(*args: str):
    from pipelines.cli import app

    return CliRunner().invoke(app, ["run", *args])


def _refused(result, message: str) -> bool:
    """The command failed and said `message` (rich wraps the error box: compare words, not lines)."""
    said = " ".join(result.output.replace("│", " ").split())
    return result.exit_code != 0 and " ".join(message.split()) in said


def test_run_refuses_a_folder_that_holds_a_run_unless_resumed(tmp_path):
    (tmp_path / "config.yaml").write_text('{"run_dir": "x"}')
    result = _invoke("--run-dir", str(tmp_path), "--preset", "cpu_smoke")
    assert result.exit_code != 0 and "--resume" in result.output


def _saved(run_dir, **flags):
    """A run's config.yaml in `run_dir`, as `spotlight run` saves it when it starts."""
    from pipelines.run import resolve_run, save_run_config

    config = resolve_run(run_dir, resume=False, flags=flags).config
    save_run_config(config)
    return config


def test_resume_refuses_flags_that_differ_from_the_stored_run(tmp_path):
    _saved(tmp_path, preset="cpu_smoke", iterations=2)
    result = _invoke("--run-dir", str(tmp_path), "--resume", "--iterations", "5")
    assert _refused(result, "train.iterations 5 (--iterations; the run has 2)")


def test_resume_refuses_a_prompts_file_that_changed_since_the_run_started(tmp_path):
    from pipelines.run import resolve_run

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red square\na blue circle\n")
    _saved(tmp_path / "run", preset="cpu_smoke", prompts=str(prompts))
    config = resolve_run(tmp_path / "run", resume=True, flags={}).config  # the same file: the run continues
    assert config.train.prompts == str(prompts)
    prompts.write_text("a red square\na blue circle\ntwo green triangles\n")
    with pytest.raises(ValueError, match=f"--prompts {re.escape(str(prompts))} changed since the run started"):
        resolve_run(tmp_path / "run", resume=True, flags={})
    result = _invoke("--run-dir", str(tmp_path / "run"), "--resume")  # rich wraps the long path: words only
    assert _refused(result, "changed since the run started") and _refused(result, "restore the file to continue")
    assert not (tmp_path / "run" / "ledger.duckdb").exists()  # refused before anything ran
    prompts.unlink()
    assert _refused(_invoke("--run-dir", str(tmp_path / "run"), "--resume"), "no such file")


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--preset", "huge", "unknown preset"),
        ("--reward", "beauty", "unknown reward"),
        ("--store", "ftp://h/x", "store URL scheme"),
        ("--queue", "amqp://h", "queue URL scheme"),
        ("--rollouts", "magic", "--rollouts"),
        ("--local-workers", "0", "workers.local_workers must be >= 1 (0 only on a Redis deployment.queue"),
        ("--preemptions-per-hour", "-1", "--preemptions-per-hour: workers.preemptions_per_hour: Input should be"),
        ("--explore-samples", "64", "explore.explore_samples (a budget in samples) is for deployment.rollouts inproc"),
    ],
)
def test_bad_flags_fail_before_any_compute(tmp_path, flag, value, message):
    result = _invoke("--run-dir", str(tmp_path / "r"), flag, value)
    assert _refused(result, message)
    assert not (tmp_path / "r" / "ledger.duckdb").exists()


def test_the_default_run_samples_on_a_preempted_local_pool(tmp_path):
    from pipelines.deploy import build_resources
    from pipelines.run import resolve_run

    config = resolve_run(tmp_path / "r", resume=False, flags={}).config
    assert (config.deployment.rollouts, config.preset) == ("local_pool", "cpu_tiny_spot")
    run_config = build_resources(config)["run_config"]
    train = run_config.train
    assert train.seeds_per_request == train.group_size and train.rollouts_per_prompt is None  # whole groups, explored
    assert config.workers.local_workers >= 2 and config.workers.preemptions_per_hour > 0
    assert run_config.sampling.mode == "workers"  # the run-long cluster pulls from the queue


def test_the_run_seed_reaches_the_prompt_schedule_and_is_kept_for_resume(tmp_path):
    from pipelines.deploy import build_resources
    from pipelines.run import resolve_run

    config = _saved(tmp_path / "r", seed=3)
    assert build_resources(config)["run_config"].train.seed == 3
    assert resolve_run(tmp_path / "r", resume=True, flags={}).config.train.seed == 3
    with pytest.raises(ValueError, match="train.seed 4 "):
        resolve_run(tmp_path / "r", resume=True, flags={"seed": 4})


def test_overwrite_checks_every_flag_before_deleting_the_old_run(tmp_path):
    old = tmp_path / "r"
    old.mkdir()
    (old / "config.yaml").write_text('{"run_dir": "x"}')
    result = _invoke("--run-dir", str(old), "--overwrite", "--preset", "huge")
    assert _refused(result, "unknown preset")
    assert (old / "config.yaml").is_file()


@pytest.mark.parametrize(
    "setup, extra, message",
    [
        ("other files", [], "holds no spotlight run"),
        ("a run", ["--resume"], "--resume"),
        ("a run", ["--store", "s3://b/p"], "--store"),
    ],
)
def test_overwrite_refuses_what_it_could_not_clear_cleanly(tmp_path, setup, extra, message):
    folder = tmp_path / "r"
    folder.mkdir()
    marker = folder / ("notes.txt" if setup == "other files" else "config.yaml")
    marker.write_text("{}")
    result = _invoke("--run-dir", str(folder), "--overwrite", *extra)
    assert _refused(result, message)
    assert marker.is_file()


def _spotlight_run(run_dir: Path, checkpoint: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [str(Path(sys.executable).parent / "spotlight"), "run", "--run-dir", str(run_dir), *extra]
    if "--resume" not in extra:
        cmd += ["--preset", "cpu_smoke", "--iterations", "2", "--checkpoint", str(checkpoint)]
    return subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def _content(run_dir: Path, queries: dict[str, str]) -> dict:
    from resources.ledger.db import query_ledger

    return {name: query_ledger(run_dir / "ledger.duckdb", sql).rows for name, sql in queries.items()}


@pytest.mark.nightly
@pytest.mark.slow
def test_killed_run_resumes_to_the_ledger_of_an_uninterrupted_run(tmp_path, tiny_policy):
    """In-process rollouts, and exploration in process on a budget in samples, make a run deterministic: the resumed
    ledger must equal a fresh one."""
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "tiny")
    # Both runs are named "r" (the folder's name), so request ids and store keys match.
    whole, killed = tmp_path / "a" / "r", tmp_path / "b" / "r"
    proc = _spotlight_run(killed, tmp_path / "tiny", "--rollouts", "inprocess", "--explore-samples", "16")
    _kill_once_iteration_1_has_results(proc, killed)
    assert _content(killed, CONTENT_QUERIES)["iterations"][-1][2] == "running"  # it died mid-iteration

    resumed = _spotlight_run(killed, tmp_path / "tiny", "--resume")
    assert resumed.wait(timeout=900) == 0, resumed.stderr.read()
    fresh = _spotlight_run(whole, tmp_path / "tiny", "--rollouts", "inprocess", "--explore-samples", "16")
    assert fresh.wait(timeout=900) == 0, fresh.stderr.read()

    got, expected = _content(killed, CONTENT_QUERIES), _content(whole, CONTENT_QUERIES)
    assert [r[:3] for r in got["iterations"]] == [(0, 0, "succeeded"), (1, 1, "succeeded"), (2, 2, "succeeded")]
    explored = [r for r in got["requests"] if r[0].startswith("explore-")]
    assert len(explored) == 4 and {r[5] for r in explored} == {"done"}  # 2 iterations x 2 prompts, all in budget
    for table in CONTENT_QUERIES:
        assert got[table] == expected[table], table
    assert (killed / "report" / "index.html").is_file()


# What must survive a kill of the default run (rollouts and exploration on worker processes). Which seeds
# exploration finds depends on timing, so two such runs differ; a resumed one must still neither redo a
# finished iteration nor hold anything twice.
CLUSTER_QUERIES = {
    "iterations": "SELECT iteration, weights_version, status FROM iterations ORDER BY 1",
    "rollouts": "SELECT iteration, count(*), count(result_hash) FROM requests "
    "WHERE kind = 'rollout' AND status = 'done' GROUP BY 1 ORDER BY 1",
    "iteration_0": "SELECT request_id, result_hash, finished_at FROM requests WHERE iteration = 0 ORDER BY 1",
    "train_0": "SELECT * FROM train_steps WHERE iteration = 0",
    "validations": "SELECT iteration, count(*) FROM validation GROUP BY 1 ORDER BY 1",
    "workers": "SELECT worker_id, end_reason FROM workers WHERE role = 'rollout' ORDER BY 1",
}


@pytest.mark.slow
def test_killed_cluster_run_resumes_without_redoing_or_duplicating_work(tmp_path, tiny_policy):
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "tiny")
    killed = tmp_path / "r"
    proc = _spotlight_run(killed, tmp_path / "tiny", "--preemptions-per-hour", "0")  # default rollouts: local_cluster
    _kill_once_iteration_1_has_results(proc, killed)  # the run and its worker processes, without notice
    before = _content(killed, CLUSTER_QUERIES)
    assert before["iterations"][-1][2] == "running"

    resumed = _spotlight_run(killed, tmp_path / "tiny", "--resume")
    assert resumed.wait(timeout=900) == 0, resumed.stderr.read()

    after = _content(killed, CLUSTER_QUERIES)
    assert after["iterations"] == [(0, 0, "succeeded"), (1, 1, "succeeded"), (2, 2, "succeeded")]
    assert after["rollouts"] == [(0, 8, 8), (1, 8, 8)]  # 2 prompts x 4 seeds, each once, each with a result
    assert (after["iteration_0"], after["train_0"]) == (before["iteration_0"], before["train_0"])  # not redone
    assert after["validations"] == [(0, 1), (1, 1), (2, 1)]
    # The killed run's workers are closed as interrupted; the resumed run's got new ids and finished.
    assert after["workers"] == [
        ("w0.0", "interrupted"),
        ("w0s1.0", "finished"),
        ("w1.0", "interrupted"),
        ("w1s1.0", "finished"),
    ]
    assert (killed / "report" / "preemptions.png").is_file()


def _kill_once_iteration_1_has_results(proc: subprocess.Popen, run_dir: Path) -> None:
    mid_iteration_1 = run_dir / "store" / "runs" / run_dir.name / "rollouts" / "it-000001"
    deadline = time.monotonic() + 600
    while not (mid_iteration_1.is_dir() and any(mid_iteration_1.iterdir())):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, "iteration 1 never started"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
