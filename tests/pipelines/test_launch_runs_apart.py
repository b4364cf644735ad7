"""Two runs launched side by side stay apart: their worker jobs carry their cluster's name, so `spotlight down` of one
and a relaunch of the other touch only their own jobs (SkyPilot's ManagedJobRecords in the stand-in controller)."""

from __future__ import annotations

import pytest

from tests.pipelines.sky_fakes import invoke as _invoke
from tests.pipelines.sky_fakes import job, start_node_redis, stop_node_redis


@pytest.fixture
def two_nodes(fake_sky, reserved_redis, tmp_path):
    """The reserved nodes of run-a and run-b, each with its own Redis (its own run's CA), the same password."""
    nodes = {}
    for cluster in ("run-a", "run-b"):
        nodes[cluster] = start_node_redis(cluster, tmp_path / cluster, reserved_redis.password)
        fake_sky.addresses[cluster] = f"127.0.0.1:{nodes[cluster].port}"
    yield nodes
    for node in nodes.values():
        stop_node_redis(node)


@pytest.fixture
def spotlight(monkeypatch):
    """`spotlight ARGS` as its own process would run: nothing left in the environment by an earlier command (launch
    and status put the run's CA there)."""

    def run(*args: str):
        monkeypatch.setenv("SPOTLIGHT_REDIS_RUN_CA", "")
        return _invoke(*args)

    return run


def _launch(spotlight, cluster: str, workers: int):
    return spotlight("launch", "--cluster", cluster, "--spot-workers", str(workers), "--store", f"s3://b/{cluster}")


def test_two_runs_side_by_side_then_one_taken_down_leaves_the_others_workers_running(
    fake_sky, two_nodes, spotlight
) -> None:
    fake_sky.jobs = [job("other-run-a-rollout-1", 90, "RUNNING")]  # a third run, whose name ends like run-a's
    for cluster in ("run-a", "run-b"):
        result = _launch(spotlight, cluster, 2)
        assert result.exit_code == 0, result.output
        assert "already running" not in result.output  # run-b is not mistaken for run-a's workers
    assert sorted(fake_sky.running()) == [
        "other-run-a-rollout-1",
        "run-a-rollout-1",
        "run-a-rollout-2",
        "run-b-rollout-1",
        "run-b-rollout-2",
    ]
    for _, (task, name), _ in [c for c in fake_sky.calls if c[0] == "jobs.launch"]:
        cluster = name.rsplit("-rollout-", 1)[0]
        assert task.name == name and task.envs["SPOTLIGHT_STORE"] == f"s3://b/{cluster}"
    fake_sky.calls.clear()
    down = spotlight("down", "--cluster", "run-a", "--yes")
    assert down.exit_code == 0, down.output
    assert [c[:2] for c in fake_sky.calls][-1] == ("down", ("run-a",))
    # run-b's workers still run, and so does other-run-a's (SkyPilot's name_match alone would have matched it)
    assert sorted(fake_sky.running()) == ["other-run-a-rollout-1", "run-b-rollout-1", "run-b-rollout-2"]
    status = spotlight("status", "--cluster", "run-b", "--json")
    assert status.exit_code == 0, status.output
    assert '"run-b-rollout-1"' in status.output and "run-a-rollout" not in status.output


def test_a_relaunch_skips_only_its_own_runs_running_workers(fake_sky, two_nodes, spotlight) -> None:
    # other-run-a's worker 2: SkyPilot's name_match (SQL LIKE %run-a-rollout-%) returns it for run-a too
    fake_sky.jobs = [job("run-a-rollout-1", 4, "RUNNING"), job("other-run-a-rollout-2", 5, "RUNNING")]
    result = _launch(spotlight, "run-a", 2)
    assert result.exit_code == 0, result.output
    launched = [args[1] for name, args, _ in fake_sky.calls if name == "jobs.launch"]
    assert launched == ["run-a-rollout-2"]  # other-run-a's worker 2 is not run-a's
    assert "run-a-rollout-1 is already running (managed job 4, RUNNING)" in result.output


def test_a_run_name_never_matches_another_runs_jobs() -> None:
    from resources.cloud import is_run_worker, worker_job_name

    assert worker_job_name("run-a", 3) == "run-a-rollout-3" and is_run_worker("run-a-rollout-3", "run-a")
    for other in ("run-ab-rollout-3", "x-run-a-rollout-3", "run-a-rollout-3x", "run-a-rollout-", "spotlight-rollout-1"):
        assert not is_run_worker(other, "run-a"), other
    assert not is_run_worker("run-a-rollout-1", "run.a")  # the name is a literal, not a pattern
