"""Every command works from a directory outside the checkout, as a pip-installed user runs it, with relative paths."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT
from tests.runs import run_command

ROOT = REPO_ROOT
SPOTLIGHT = Path(sys.executable).parent / "spotlight"


def _bench_names() -> list[str]:
    from typer.main import get_command

    from pipelines.cli import app

    return sorted(get_command(app).commands["bench"].commands)


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """An empty working directory that is not the checkout nor inside it."""
    assert ROOT not in tmp_path.resolve().parents
    return tmp_path


def _run(cwd: Path, *args: str, timeout_s: float = 120):
    """Run a command in `cwd` as a user's shell would (tests/runs.py)."""
    return run_command(cwd, *args, timeout_s=timeout_s)


@pytest.mark.parametrize(
    "args",
    [[], ["train"], ["run"], ["pretrain"], ["ledger"]] + [["bench", name] for name in _bench_names()],
    ids=" ".join,
)
def test_every_spotlight_command_answers_help_from_another_directory(elsewhere, args):
    done = _run(elsewhere, str(SPOTLIGHT), *args, "--help")
    assert done.returncode == 0, done.stderr
    assert "Usage: spotlight" in done.stdout


@pytest.mark.parametrize(
    "module",
    [
        "pipelines",
        "pipelines.cli",
        "workers.rollout",
        "workers.sp",
        "workers.pulse.loco.worker",
        "workers.coordinator.loco",
    ],
)
def test_every_python_m_entry_point_answers_help_from_another_directory(elsewhere, module):
    done = _run(elsewhere, sys.executable, "-m", module, "--help")
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout.lower()


def test_train_with_a_relative_out_writes_there_and_the_ledger_command_reads_it(smoke_train):
    """`spotlight train --out rel/train` run in a folder outside the checkout (the session's golden train)."""
    assert [r["iteration"] for r in smoke_train.records()] == [0, 1, 2]
    assert smoke_train.path("rel/train/ledger.duckdb").is_file()
    assert smoke_train.path("rel/train/policy/policy.json").is_file()

    queried = _run(
        smoke_train.cwd,
        str(SPOTLIGHT),
        "ledger",
        "SELECT iteration, status FROM iterations ORDER BY 1",
        "--db",
        "rel/train/ledger.duckdb",
        "--json",
    )
    assert queried.returncode == 0, queried.stderr
    assert [json.loads(line) for line in queried.stdout.splitlines()] == [
        {"iteration": 0, "status": "succeeded"},
        {"iteration": 1, "status": "succeeded"},
        {"iteration": 2, "status": "succeeded"},
    ]
    assert not (ROOT / "rel").exists()  # nothing landed in the checkout


def test_a_cluster_run_started_outside_the_checkout_finishes_with_its_files_where_asked(smoke_cluster_run):
    """Regression: the workers ran in the checkout and opened another, empty runs/run/queue.db, while the
    coordinator waited forever on its own. The session's cluster run, `--run-dir rel/cluster` from elsewhere."""
    from resources.ledger.db import query_ledger

    ledger = smoke_cluster_run.path("rel/cluster/ledger.duckdb")
    assert query_ledger(ledger, "SELECT iteration, status FROM iterations ORDER BY 1").rows == [
        (0, "succeeded"),
        (1, "succeeded"),
    ]
    rollouts = query_ledger(ledger, "SELECT count(*), count(result_hash) FROM requests WHERE kind = 'rollout'").rows
    assert rollouts[0][0] > 0 and rollouts[0][0] == rollouts[0][1]
    assert smoke_cluster_run.path("rel/cluster/worker_logs").is_dir()
    assert not (ROOT / "rel").exists()  # nothing landed in the checkout


def test_the_cluster_hands_its_workers_absolute_paths_and_leaves_urls_alone(elsewhere, monkeypatch):
    from resources.cluster import ClusterConfig, WorkerSlot

    monkeypatch.chdir(elsewhere)
    local = ClusterConfig("rel/queue.db", "rel/store", log_dir="rel/logs")
    assert (local.queue_url, local.store_url, local.log_dir) == tuple(
        str(elsewhere.resolve() / "rel" / name) for name in ("queue.db", "store", "logs")
    )
    assert WorkerSlot("w0", queue_url="own.db").queue_url == str(elsewhere.resolve() / "own.db")
    remote = ClusterConfig("redis://:pw@host:6379/0", "s3://bucket/prefix")
    assert (remote.queue_url, remote.store_url) == ("redis://:pw@host:6379/0", "s3://bucket/prefix")


def test_a_relative_run_folder_means_relative_to_where_the_run_was_started(elsewhere, monkeypatch):
    from pipelines.run import resolve_run, save_run_config

    monkeypatch.chdir(elsewhere)
    flags = {"store": "rel/store", "queue": "redis://host:6379/0"}
    config = resolve_run(Path("rel/run"), resume=False, flags=flags).config
    d = config.deployment
    assert (d.run_dir, d.store, d.queue) == (
        str(elsewhere.resolve() / "rel" / "run"),
        str(elsewhere.resolve() / "rel" / "store"),
        "redis://host:6379/0",
    )
    save_run_config(config)
    # Resumed from inside the run's parent with the same flags written relative to there: the same run.
    monkeypatch.chdir(elsewhere / "rel")
    resumed = resolve_run(Path("run"), resume=True, flags={"store": "store"}).config
    assert resumed == config
