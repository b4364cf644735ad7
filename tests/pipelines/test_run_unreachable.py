"""`spotlight run` against a queue or store it cannot reach: one line naming the address, at once, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest


def _spotlight_run(tmp_path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipelines", "run", "--run-dir", str(tmp_path / "run"), *args],
        cwd=tmp_path,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again on exit: nothing listens there


@pytest.mark.parametrize("queue", ["redis://127.0.0.1:{port}/0", "redis://:secret-pw@127.0.0.1:{port}/3"])
def test_an_unreachable_redis_queue_stops_the_run_at_once_in_one_line(tmp_path, queue) -> None:
    port = _closed_port()
    started = time.monotonic()
    done = _spotlight_run(tmp_path, "--queue", queue.format(port=port), "--rollouts", "local_cluster")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0] and "cannot reach" in lines[0], done.stderr
    assert "Traceback" not in done.stderr + done.stdout and "secret-pw" not in done.stderr
    assert not (tmp_path / "run").exists()  # no run.json, ledger, store or worker started
    assert time.monotonic() - started < 60


def test_an_unreachable_s3_endpoint_stops_the_run_at_once_in_one_line(tmp_path) -> None:
    port = _closed_port()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }
    done = _spotlight_run(tmp_path, "--store", "s3://spotlight-test/runs", env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"127.0.0.1:{port}" in lines[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()


def test_a_missing_bucket_stops_the_run_naming_it(tmp_path, s3_server) -> None:
    done = _spotlight_run(tmp_path, "--store", "s3://no-such-bucket-here/runs")
    assert done.returncode == 2 and "no-such-bucket-here" in done.stderr and "does not exist" in done.stderr, (
        done.stderr
    )
    assert not (tmp_path / "run").exists()
