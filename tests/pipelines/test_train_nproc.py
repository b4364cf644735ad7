"""`spotlight train --nproc N`: every rank samples its part of each iteration's requests and the update is sharded
over the N trainer processes (FSDP2 over gloo ranks on the CPU); the run equals the one process's within float
rounding; bad --nproc values fail before any compute.

Tolerance: the ranks' reduce-scatter sums gradients in another order than one backward (tests/workers/trainer/
test_fsdp.py), so weights agree to float rounding (measured: at most 1.3e-7 after cpu_smoke's two updates), the
training stats to 6 digits. The held-out score is not compared: MiniGenEval's detector flips an image or two on
differences that small (tests/golden.py says the same of AVX2 vs AVX512 kernels).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.paths import REPO_ROOT

SPOTLIGHT = Path(sys.executable).parent / "spotlight"
STATS = (
    "loss",
    "grad_norm",
    "kl",
    "clip_frac",
    "approx_kl",
    "reward_mean",
    "reward_std",
    "zero_std_ratio",
    "optimizer_steps",
    "learning_rate",
)


def _train(cwd: Path, out: Path, *args: str, timeout_s: float = 900) -> list[dict]:
    """`spotlight train --preset cpu_smoke` in `cwd` (absolute paths throughout); its JSON records."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed package, not a path hack
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.Popen(
        [str(SPOTLIGHT), "train", "--preset", "cpu_smoke", "--out", str(out), "--json", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank it started
        stdout, stderr = proc.communicate()
        pytest.fail(f"spotlight train {' '.join(args)} did not finish in {timeout_s:g} s:\n{stderr[-3000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return [json.loads(line) for line in stdout.splitlines()]


def _final_state(run_dir: Path) -> tuple[dict, dict]:
    """The run's final checkpoint (version 2) in its store: (weights, AdamW state tensors)."""
    from resources.store import open_store
    from workers.coordinator.context import run_name_for
    from workers.trainer.checkpoint import load_checkpoint

    policy, optimizer = load_checkpoint(open_store(str(run_dir / "store")), run_name_for(run_dir), 2)
    return policy.weights(), optimizer.whole_tensors()  # the ranks' run stored it sharded: read back whole


def _samplers(run_dir: Path) -> dict[int, dict[str, int]]:
    """Per iteration, how many rollout requests each worker committed (the ledger's requests rows)."""
    from resources.ledger import Ledger

    ledger = Ledger(run_dir / "ledger.duckdb")
    try:
        rows = ledger.query(
            "SELECT iteration, worker_id, count(*) FROM requests WHERE kind = 'rollout' GROUP BY ALL"
        ).rows
    finally:
        ledger.close()
    out: dict[int, dict[str, int]] = {}
    for iteration, worker, count in rows:
        out.setdefault(int(iteration), {})[worker] = int(count)
    return out


@pytest.mark.slow  # a cpu_smoke run in two processes (~1 min on 2 idle cores); the one-process run is the session's
@pytest.mark.timeout(900)
def test_two_trainer_processes_train_the_run_one_process_trains(tmp_path, smoke_train):
    assert REPO_ROOT not in tmp_path.resolve().parents, "the runs must start outside the checkout"
    alone = smoke_train.records()
    ranks = _train(tmp_path, tmp_path / "ranks", "--seed", "0", "--nproc", "2", "--gradient-checkpointing")
    assert [r["iteration"] for r in ranks] == [r["iteration"] for r in alone] == [0, 1, 2]
    for mine, theirs in zip(ranks[:2], alone[:2], strict=False):  # the two updates (iteration 2 only validates)
        assert mine["grad_norm"] > 0
        for key in STATS:
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
    (weights, optimizer), (weights_alone, optimizer_alone) = map(
        _final_state, (tmp_path / "ranks", smoke_train.path("rel/train"))
    )
    from workers.model.tiny_policy import SHIPPED_BASE, load_policy

    base = load_policy(SHIPPED_BASE).weights()
    assert max(float((weights[k] - base[k]).abs().max()) for k in base) > 1e-4, "the updates moved no weight"
    torch.testing.assert_close(weights, weights_alone, atol=1e-5, rtol=1e-4)
    assert set(optimizer) == set(optimizer_alone)  # AdamW's state from the ranks' shards, keyed as one process keys it
    torch.testing.assert_close(optimizer, optimizer_alone, atol=1e-6, rtol=1e-3)
    assert _samplers(tmp_path / "ranks") == {
        0: {"trainer-rank0": 4, "trainer-rank1": 4},
        1: {"trainer-rank0": 4, "trainer-rank1": 4},
    }
    assert _samplers(smoke_train.path("rel/train")) == {0: {"trainer": 8}, 1: {"trainer": 8}}
    saved = load_policy(tmp_path / "ranks" / "policy").weights()
    torch.testing.assert_close(saved, weights, atol=0, rtol=0)  # rank 0 wrote the final policy folder


@pytest.mark.parametrize(
    "args, says",
    [
        (["--nproc", "0"], "--nproc: train.nproc: Input should be greater than or equal to 1"),
        (["--nproc", "16"], "cannot be split over 16 ranks"),  # cpu_smoke trains 8 samples per minibatch
    ],
)
def test_bad_nproc_fails_before_any_compute(tmp_path, args, says):
    from pipelines.cli import app

    done = CliRunner().invoke(app, ["train", "--preset", "cpu_smoke", "--out", str(tmp_path / "run"), *args])
    assert done.exit_code != 0 and says in re.sub(r"[\s│]+", " ", done.output)  # typer's error box wraps lines
    assert not (tmp_path / "run").exists(), "a refused run must write nothing"


def test_nproc_needs_one_gpu_per_rank_and_the_plain_cuda_device():
    from workers.trainer.launch import check_nproc

    too_many = max(2, (torch.cuda.device_count() if torch.cuda.is_available() else 0) + 1)
    with pytest.raises(ValueError, match=f"needs {too_many} CUDA devices"):
        check_nproc(too_many, "cuda")
    with pytest.raises(ValueError, match="pass --device cuda"):
        check_nproc(2, "cuda:1")
    with pytest.raises(ValueError, match="cpu \\(gloo\\) or cuda"):
        check_nproc(2, "mps")
    check_nproc(2, "cpu")
    check_nproc(1, "cuda:3")  # one process: --device alone decides
