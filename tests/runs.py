"""Runs of the installed `spotlight` command, as a pip-installed user starts them: from a folder outside the
checkout, with relative paths, without PYTHONPATH. conftest.py starts the runs several test files read once per
test session (`smoke_train`, `smoke_run`, `smoke_cluster_run`); a test that needs a run of its own calls
`spotlight` here too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.golden import GOLDEN_ARGS
from tests.paths import REPO_ROOT

SPOTLIGHT = Path(sys.executable).parent / "spotlight"


@dataclass(frozen=True)
class CommandRun:
    """One finished command: where it ran, what it was given and what it printed."""

    cwd: Path
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def records(self) -> list[dict]:
        """The JSON Lines it printed on stdout (`--json`)."""
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]

    def path(self, relative: str) -> Path:
        """A path the command was given relative to its working folder."""
        return self.cwd / relative


def outside_env() -> dict[str, str]:
    """The environment of a user's shell: the installed package (no PYTHONPATH), one torch thread a process."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return env


def run_command(cwd: Path, *args: str, timeout_s: float = 240) -> CommandRun:
    """ARGS (a program and its arguments) in `cwd` with `outside_env()`, in its own process group; on a timeout the
    command and every process it started are killed and the test fails saying so."""
    proc = subprocess.Popen(
        list(args),
        cwd=cwd,
        env=outside_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"{' '.join(args)} in {cwd} did not finish in {timeout_s:g} s; stderr:\n{stderr[-3000:]}")
    return CommandRun(cwd, tuple(args), proc.returncode, stdout, stderr)


def spotlight(cwd: Path, *args: str, timeout_s: float = 240, check: bool = True) -> CommandRun:
    """`spotlight ARGS` in `cwd`, outside the checkout (`run_command`). With `check`, a non-zero exit fails the test
    with its stderr."""
    assert REPO_ROOT not in cwd.resolve().parents and cwd.resolve() != REPO_ROOT, "run it outside the checkout"
    done = run_command(cwd, str(SPOTLIGHT), *args, timeout_s=timeout_s)
    if check:
        assert done.returncode == 0, f"spotlight {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return done


SMOKE_TRAIN_ARGS = (*GOLDEN_ARGS["train"], "--out", "rel/train")
"""The golden `spotlight train`: two tiny GRPO iterations (tests/golden.py)."""
SMOKE_NFT_TRAIN_ARGS = (*GOLDEN_ARGS["train_nft"], "--out", "rel/train_nft")
"""The golden of the default objective, NFT, at cpu_smoke's size."""
SMOKE_RUN_ARGS = (*GOLDEN_ARGS["run"], "--run-dir", "rel/run")
"""The golden `spotlight run`: the same two iterations through the Dagster walk (a run named "run")."""
SMOKE_CLUSTER_ARGS = (
    "run",
    "--preset",
    "cpu_smoke",
    "--iterations",
    "1",
    "--preemptions-per-hour",
    "120",
    "--run-dir",
    "rel/cluster",
)
"""The default rollouts (a local cluster of spot worker processes) under preemptions: at 120 per worker-hour the
seeded trace kills a worker within a second of the cluster being ready, then about every 30 s."""


def run_resources(run_dir: Path, mode: str | None = None, **settings) -> dict:
    """The Dagster resources of a run in `run_dir` with these settings (field names, as flags give them) over the
    preset; `mode`: how rollout phases sample (inprocess, local_cluster, workers; default: what
    deployment.rollouts means in `spotlight run`)."""
    from pipelines.deploy import build_resources
    from resources.settings.resolve import flag_layer, resolve
    from workers.trainer.presets import PRESETS

    config = resolve([flag_layer({"run_dir": str(run_dir), **settings})], PRESETS).config
    return build_resources(config, mode)
