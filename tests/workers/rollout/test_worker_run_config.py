"""A worker handed the run's config file (`--config`) takes its knobs from there: set once in the user's run.yaml,
a knob reaches every worker process, whether started by hand or by a local cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from resources.cluster import ClusterConfig, LocalCluster, WorkerSlot
from resources.settings.resolve import file_layer, resolve, to_yaml
from tests.paths import REPO_ROOT
from workers.trainer.presets import PRESETS


def _saved_config(tmp_path: Path, run_yaml: str) -> Path:
    """The user's run.yaml resolved as every spotlight command resolves it, saved as the run's config.yaml."""
    (tmp_path / "run.yaml").write_text(run_yaml)
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(resolve([file_layer(tmp_path / "run.yaml")], PRESETS).config))
    return saved


def _worker(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "workers.rollout", "--queue", str(tmp_path / "q.db")]
    command += ["--store", str(tmp_path / "store"), "--threads", "1", "--max-idle-s", "0.2", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120, env=env)


def _ready(done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr
    return next(e for e in map(json.loads, done.stdout.splitlines()) if e["event"] == "ready")


def test_a_worker_takes_its_knobs_from_the_run_config_and_a_flag_given_as_well_wins(tmp_path) -> None:
    saved = _saved_config(tmp_path, "workers:\n  lease_s: 7\n  commit_every: 3\n")
    ready = _ready(_worker(tmp_path, "--config", str(saved)))
    assert (ready["lease_s"], ready["commit_every"]) == (7.0, 3)
    ready = _ready(_worker(tmp_path, "--config", str(saved), "--lease-s", "5"))
    assert (ready["lease_s"], ready["commit_every"]) == (5.0, 3)
    plain = _ready(_worker(tmp_path))  # no file: the tree's defaults
    assert (plain["lease_s"], plain["commit_every"]) == (10.0, 2)


@pytest.mark.parametrize(
    "text, message",
    [("workers:\n  lease_s: 7\n  leese_s: 8\n", "leese_s"), ("workers:\n  lease_s: -1\n", "greater than 0")],
)
def test_a_run_config_the_worker_cannot_use_stops_it_naming_the_file(tmp_path, text, message) -> None:
    bad = tmp_path / "config.yaml"
    bad.write_text(text)
    done = _worker(tmp_path, "--config", str(bad))
    assert done.returncode == 2 and f"--config {bad}" in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_lease_set_once_in_run_yaml_reaches_the_worker_a_local_cluster_spawns(tmp_path) -> None:
    saved = _saved_config(tmp_path, "workers.lease_s: 7\nworkers.restart_delay_s: 1.5\n")
    config = ClusterConfig.for_run(str(tmp_path / "q.db"), str(tmp_path / "store"), saved)
    assert (config.lease_s, config.restart_delay_s, config.run_config) == (7.0, 1.5, str(saved))
    cluster = LocalCluster(config, [WorkerSlot("w0")])
    seen: list[dict] = []
    on_event = cluster.tracker.on_event
    cluster.tracker.on_event = lambda event: (seen.append(event), on_event(event))  # type: ignore[method-assign]
    with cluster:
        (proc,) = cluster._live.values()
        argv = proc.popen.args
    assert argv[argv.index("--config") + 1] == str(saved) and "--lease-s" not in argv  # the file, not a flag per knob
    assert [e["lease_s"] for e in seen if e["event"] == "ready"] == [7.0]
