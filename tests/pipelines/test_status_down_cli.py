"""`spotlight status` and `spotlight down` with SkyPilot's own records and exceptions (tests/pipelines/sky_fakes.py):
what status shows, that it never echoes a password, and that down takes the reserved node down whatever state the
jobs controller is in."""

from __future__ import annotations

import json
import time

import pytest

from tests.pipelines.sky_fakes import invoke as _invoke
from tests.pipelines.sky_fakes import job
from tests.pipelines.sky_fakes import node_queue as _node_queue


def test_status_shows_iteration_score_spend_workers_and_queue_depth(redis_server, tmp_path, monkeypatch) -> None:
    from resources.ledger import Ledger
    from resources.queue import open_queue

    redis_server.flush()
    monkeypatch.setenv("SPOTLIGHT_REDIS_PASSWORD", redis_server.password)
    with Ledger(tmp_path / "ledger.duckdb") as ledger:
        ledger.start_worker(
            "vm-1", role="rollout", instance_type="x", spot=True, usd_per_hour=36.0, at=time.time() - 100
        )
        ledger.start_iteration(0)
        ledger.end_iteration(0)
    with open_queue(f"redis://127.0.0.1:{redis_server.port}/0") as queue:
        queue.put([{"request_id": f"r{i}", "iteration": 1, "kind": "rollout", "payload": {}} for i in range(3)])
        queue.publish_info({"heldout_score": 0.4, "max_usd": 10.0})
    args = [
        "status",
        "--queue",
        f"redis://127.0.0.1:{redis_server.port}/0",
        "--ledger",
        str(tmp_path / "ledger.duckdb"),
    ]
    record = json.loads(_invoke(*args, "--json").output)
    assert record["iteration"] == 0 and record["queue_pending"] == 3 and record["workers_alive"] == 1
    assert record["usd_total"] == pytest.approx(1.0, abs=0.05) and record["max_usd"] == 10.0
    text = _invoke(*args).output
    assert "iteration 0" in text and "3 pending" in text and "of $10" in text


def test_a_queue_url_with_a_password_is_never_echoed_by_status(fake_sky) -> None:
    result = _invoke("status", "--queue", "redis://:pa%22ss%5Cword-Xy9@127.0.0.1:1/0")
    assert result.exit_code == 1 and "cannot read the queue redis://127.0.0.1:1/0" in result.output
    assert "Xy9" not in result.output and "pa%22ss" not in result.output


def test_down_cancels_only_its_own_runs_worker_jobs_then_the_reserved_node(fake_sky) -> None:
    fake_sky.jobs = [
        job("spotlight-reserved-rollout-1", 4, "RUNNING"),
        job("someone-else", 5, "RUNNING"),
        job("spotlight-reserved-rollout-2", 6, "RECOVERING"),
        job("spotlight-reserved-rollout-3", 7, "CANCELLED"),
        job("spotlight-reserved-2-rollout-1", 8, "RUNNING"),  # another run's
    ]
    result = _invoke("down", "--yes")
    assert result.exit_code == 0, result.output
    assert [c[:2] for c in fake_sky.calls] == [("jobs.cancel", ([4, 6],)), ("down", ("spotlight-reserved",))]


def test_down_takes_the_reserved_node_down_when_the_jobs_controller_has_stopped(fake_sky) -> None:
    fake_sky.controller_up = False
    result = _invoke("down", "--yes")
    assert result.exit_code == 0, result.output
    assert [c[:2] for c in fake_sky.calls] == [("down", ("spotlight-reserved",))]
    assert "controller is stopped" in result.output and "spotlight-reserved is down" in result.output
    fake_sky.cluster_exists = False  # and a second down finds nothing to take down
    again = _invoke("down", "--yes")
    assert again.exit_code == 0 and "does not exist (already down)" in again.output


def test_status_without_flags_finds_the_reserved_node_and_the_spot_jobs_through_skypilot(
    fake_sky, reserved_redis, monkeypatch
) -> None:
    with _node_queue(reserved_redis, monkeypatch) as queue:
        queue.publish_info({"iteration": 4, "heldout_score": 0.61, "usd_total": 12.5, "workers_alive": 1})
    fake_sky.jobs = [
        job("spotlight-reserved-rollout-1", 4, "RECOVERING"),
        job("spotlight-reserved-rollout-2", 5, "SUCCEEDED"),
        job("someone-else", 6, "RUNNING"),
    ]
    text = _invoke("status").output
    assert "iteration 4  held-out 0.610  spent $12.50" in text and fake_sky.tunnels == ["spotlight-reserved"]
    assert "  spotlight-reserved-rollout-1  job 4  RECOVERING\n" in text + "\n" and "ManagedJobStatus" not in text
    assert "spotlight-reserved-rollout-2" not in text and "someone-else" not in text  # finished; not this run's
    record = json.loads(_invoke("status", "--json").output)
    assert record["spot_jobs"] == [{"name": "spotlight-reserved-rollout-1", "job_id": 4, "status": "RECOVERING"}]
    fake_sky.controller_up = False  # it stopped itself after its idle minutes
    stopped = _invoke("status")
    assert stopped.exit_code == 0 and "controller is stopped" in stopped.output and "iteration 4" in stopped.output
    fake_sky.address = "127.0.0.1:1"  # the node is gone
    gone = _invoke("status")
    assert gone.exit_code == 1 and "cannot read the queue" in gone.output
    fake_sky.cluster_exists = False  # taken down: SkyPilot no longer knows the cluster
    down = _invoke("status")
    assert down.exit_code == 1 and "cannot find the reserved node 'spotlight-reserved'" in down.output
    assert "Traceback" not in down.output


def test_status_of_a_public_queue_shows_the_runs_client_certificate(fake_sky, tmp_path, monkeypatch) -> None:
    """`status --public-queue` reaches a node whose Redis asks for a client certificate (mutual TLS): it signs one
    with the run's CA key kept here, as `launch` does for the workers and its spend-cap check."""
    import shutil

    from tests.pipelines.sky_fakes import start_node_redis, stop_node_redis

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    monkeypatch.setenv("SPOTLIGHT_REDIS_PASSWORD", "public-node-pass-16")
    node = start_node_redis("spotlight-reserved", tmp_path / "node-redis", "public-node-pass-16", mutual_tls=True)
    fake_sky.address = f"127.0.0.1:{node.port}"  # the node's public endpoint
    try:
        with _node_queue(node, monkeypatch, client_cert=True) as queue:
            queue.publish_info({"iteration": 4, "heldout_score": 0.61, "usd_total": 12.5, "workers_alive": 1})
        for name in ("SPOTLIGHT_REDIS_RUN_CA", "SPOTLIGHT_REDIS_CLIENT_CERT", "SPOTLIGHT_REDIS_CLIENT_KEY"):
            monkeypatch.setenv(name, "")  # a fresh shell: only the TLS files kept under the state folder
        result = _invoke("status", "--public-queue")
        assert result.exit_code == 0, result.output
        assert "iteration 4  held-out 0.610  spent $12.50" in result.output and fake_sky.tunnels == []
    finally:
        stop_node_redis(node)
