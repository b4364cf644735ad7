"""`spotlight run --nproc N`: the Dagster walk on rank 0 of N trainer processes trains what one process trains, a
killed ranked run resumes on its ranks, and bad --nproc values fail before any compute or file.

Tolerance as in tests/pipelines/test_train_nproc.py: the ranks' reduce-scatter sums gradients in another order than
one backward, so weights agree to float rounding and the training stats to about 6 digits.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from tests.paths import REPO_ROOT

SPOTLIGHT = Path(sys.executable).parent / "spotlight"
TRAIN_STATS = (
    "loss",
    "kl",
    "reward_mean",
    "reward_std",
    "zero_std_ratio",
    "clip_fraction",
    "grad_norm",
    "learning_rate",
)


def _start(cwd: Path, run_dir: Path, *args: str) -> subprocess.Popen:
    """`spotlight run` in `cwd` (the installed command, outside the checkout), in its own process group."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.Popen(
        [str(SPOTLIGHT), "run", "--run-dir", str(run_dir), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout_s: float = 900) -> str:
    """Wait for a run; its stderr. Fails (killing the run, its ranks and workers) on a timeout or an error."""
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"spotlight run did not finish in {timeout_s:g} s:\n{proc.communicate()[1][-3000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return stderr


def _kill_once_iteration_1_has_results(proc: subprocess.Popen, run_dir: Path) -> None:
    mid_iteration_1 = run_dir / "store" / "runs" / run_dir.name / "rollouts" / "it-000001"
    deadline = time.monotonic() + 600
    while not (mid_iteration_1.is_dir() and any(mid_iteration_1.iterdir())):
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "iteration 1 never started"
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks, without notice
    proc.wait()


def _ledger(run_dir: Path, sql: str) -> list[tuple]:
    from resources.ledger.db import query_ledger

    return query_ledger(run_dir / "ledger.duckdb", sql).rows


def _final_state(run_dir: Path) -> tuple[dict, dict]:
    """The run's last checkpoint (version 2 of cpu_smoke): (weights, AdamW state tensors)."""
    from resources.store import open_store
    from workers.trainer.checkpoint import load_checkpoint

    policy, optimizer = load_checkpoint(open_store(str(run_dir / "store")), run_dir.name, 2)
    return policy.weights(), optimizer.whole_tensors()  # sharded by the ranks: read back whole


@pytest.mark.nightly
@pytest.mark.slow  # a cpu_smoke pipeline run in two processes, killed and resumed (~2 min on 2 idle cores)
@pytest.mark.timeout(900)
def test_a_killed_two_rank_run_resumes_on_its_ranks_and_trains_what_one_process_trains(tmp_path, smoke_run):
    assert REPO_ROOT not in tmp_path.resolve().parents, "the runs must start outside the checkout"
    # Both runs are named "run" (the folder's name), so request ids, seeds and store keys match; the one-process
    # run is the session's golden run.
    alone, ranked = smoke_run.path("rel/run"), tmp_path / "ranked" / "run"
    first = _start(
        tmp_path, ranked, "--preset", "cpu_smoke", "--rollouts", "inprocess", "--nproc", "2", "--gradient-checkpointing"
    )
    _kill_once_iteration_1_has_results(first, ranked)
    assert _ledger(ranked, "SELECT iteration, status FROM iterations ORDER BY 1")[-1] == (1, "running")
    stored = yaml.safe_load((ranked / "config.yaml").read_text())
    assert (stored["train"]["nproc"], stored["train"]["gradient_checkpointing"]) == (2, True)

    resumed = _finish(_start(tmp_path, ranked, "--resume"))  # the stored --nproc 2
    assert "trainer rank 1: joined 1 update(s)" in resumed, resumed[-3000:]  # iteration 1's, redone on both ranks

    status = "SELECT iteration, weights_version, status FROM iterations ORDER BY 1"
    assert (
        _ledger(ranked, status)
        == _ledger(alone, status)
        == [(0, 0, "succeeded"), (1, 1, "succeeded"), (2, 2, "succeeded")]
    )
    rows = f"SELECT iteration, step, {', '.join(TRAIN_STATS)} FROM train_steps ORDER BY 1, 2"
    mine, theirs = _ledger(ranked, rows), _ledger(alone, rows)
    assert [r[:2] for r in mine] == [r[:2] for r in theirs] == [(0, 0), (1, 0)]
    for row, other in zip(mine, theirs, strict=False):
        assert row[TRAIN_STATS.index("grad_norm") + 2] > 0
        for name, value, expected in zip(TRAIN_STATS, row[2:], other[2:], strict=False):
            assert value == pytest.approx(expected, rel=1e-4, abs=1e-6), (row[0], name)
    (weights, optimizer), (weights_alone, optimizer_alone) = _final_state(ranked), _final_state(alone)
    torch.testing.assert_close(weights, weights_alone, atol=1e-5, rtol=1e-4)
    assert set(optimizer) == set(optimizer_alone)
    torch.testing.assert_close(optimizer, optimizer_alone, atol=1e-6, rtol=1e-3)


def _invoke(*args: str):
    from pipelines.cli import app

    return CliRunner().invoke(app, ["run", *args], env={"COLUMNS": "300"})


@pytest.mark.parametrize(
    "args, says",
    [
        (["--nproc", "0"], "--nproc: train.nproc: Input should be greater than or equal to 1"),
        (["--preset", "cpu_smoke", "--nproc", "16"], "cannot be split over 16 ranks"),  # 8 samples per minibatch
        (["--sync-mode", "merged"], "model.sync_mode (--sync-mode): only for a diffusers pipeline"),
    ],
)
def test_bad_ranks_or_sync_mode_fail_before_any_compute_or_file(tmp_path, args, says):
    done = _invoke("--run-dir", str(tmp_path / "run"), *args)
    assert done.exit_code != 0 and says in re.sub(r"[\s│]+", " ", done.output), done.output
    assert not (tmp_path / "run").exists(), "a refused run must write nothing"


def test_merged_sync_without_a_lora_fails_before_any_compute_or_file(tmp_path):
    from workers.model.families.tiny import build_tiny_pipeline

    model = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    for mode, says in (("merged", "lora_rank > 0"), ("dense", "'dense' is not one of 'lora', 'merged'")):
        done = _invoke(
            "--run-dir",
            str(tmp_path / "run"),
            "--model",
            str(model),
            "--preset",
            "cpu_smoke",
            "--resolution",
            "32",
            "--lora-rank",
            "0",
            "--sync-mode",
            mode,
            "--rollouts",
            "inprocess",
        )
        assert done.exit_code != 0 and says in re.sub(r"[\s│]+", " ", done.output), done.output
        assert not (tmp_path / "run").exists(), "a refused run must write nothing"


def test_resume_keeps_the_stored_ranks_unless_given_and_the_sync_mode_always(tmp_path):
    from pipelines.run import resolve_run, save_run_config

    flags = {"preset": "cpu_smoke", "nproc": 2, "gradient_checkpointing": True}
    save_run_config(resolve_run(tmp_path, resume=False, flags=flags).config)
    again = resolve_run(tmp_path, resume=True, flags={}).config.train  # the node restarted with no flags
    assert (again.nproc, again.gradient_checkpointing) == (2, True)
    # Another node may have another number of GPUs: how each update is computed may change, what it computes not.
    moved = resolve_run(tmp_path, resume=True, flags={"nproc": 4, "gradient_checkpointing": False}).config
    assert (moved.train.nproc, moved.train.gradient_checkpointing, moved.preset) == (4, False, "cpu_smoke")
    with pytest.raises(ValueError, match="model.sync_mode \\(--sync-mode\\): only for a diffusers pipeline"):
        resolve_run(tmp_path, resume=True, flags={"sync_mode": "merged"})


@dataclass(frozen=True)
class _OrderingRanks:
    """Rank 0 of two whose first order stops the run: the test sees which step reached the ranks."""

    rank: int = 0
    world_size: int = 2

    def send(self, order) -> None:
        kind = "sample" if type(order).__name__ == "RolloutOrder" else "train"
        raise RuntimeError(f"rank 0 ordered the ranks to {kind} iteration {order.iteration}")


def test_the_walk_samples_in_this_process_under_its_trainer_setup(tmp_path):
    """Dagster's in-process execution runs the rollout asset's step in the walking process (rank 0), where
    `current_setup()` holds the ranks: its in-process sampling orders every rank to sample its part. (The train
    asset's step orders them to join its update: the killed run above shows rank 1 joining it.)"""
    import dagster as dg

    from pipelines.run_walk import _failure_text, materialize_iteration
    from tests.runs import run_resources
    from workers.trainer.ranks import TrainerSetup, trainer_setup

    resources = run_resources(tmp_path / "r", preset="cpu_smoke", rollouts="inprocess")
    with trainer_setup(TrainerSetup(ranks=_OrderingRanks())):
        result = materialize_iteration(dg.DagsterInstance.ephemeral(), resources, 0)
    failed = {event.step_key for event in result.all_events if event.is_step_failure}
    assert failed == {"rollouts"}, _failure_text(result, 0)
    assert "rank 0 ordered the ranks to sample iteration 0" in _failure_text(result, 0)
