"""A finished run ends its spot workers' jobs, and its record outlives the reserved node's disk."""

from __future__ import annotations

import sys
import time

import pytest

from resources.queue.base import PASSWORD_ENV
from resources.run_archive import archive_run_dir
from resources.run_status import EXIT_OVER_BUDGET, main, supervise
from resources.store import open_store

# A worker stand-in: exits 75 on SIGTERM (what a preempted worker's job recovers on), else sleeps.
WORKER = [
    sys.executable,
    "-c",
    "import signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\nprint('ready', flush=True)\ntime.sleep(60)",
]


def test_a_supervised_worker_is_stopped_and_its_job_ends_with_0_once_the_run_has_ended() -> None:
    answers = iter([{}, {"usd_total": 1.0, "max_usd": 5.0}, {"run_ended": True}])
    started = time.monotonic()
    code = supervise(WORKER, "redis://unused:6379/0", every_s=0.3, read_info=lambda url: next(answers))
    assert code == 0 and time.monotonic() - started < 20


def test_a_supervised_worker_over_the_cap_is_stopped_too_and_otherwise_keeps_its_own_exit_code() -> None:
    assert (
        supervise(
            WORKER, "redis://unused:6379/0", every_s=0.3, read_info=lambda url: {"usd_total": 5.0, "max_usd": 5.0}
        )
        == 0
    )
    exits_75 = [sys.executable, "-c", "import sys; sys.exit(75)"]  # preempted by itself: the job must recover
    assert supervise(exits_75, "redis://unused:6379/0", every_s=0.3, read_info=lambda url: {}) == 75


def test_the_gate_refuses_to_start_a_worker_once_the_reserved_node_marked_the_run_ended(redis_server, monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, redis_server.password)
    redis_server.flush()
    url = redis_server.url()
    assert main(["--queue", url, "--mark", "running"]) == 0 and main(["--queue", url]) == 0
    assert main(["--queue", url, "--mark", "ended"]) == 0 and main(["--queue", url]) == EXIT_OVER_BUDGET
    assert main(["--queue", url, "--mark", "running"]) == 0 and main(["--queue", url]) == 0  # a relaunch resumes


def test_the_run_folder_is_archived_into_the_store_byte_for_byte(tmp_path) -> None:
    run = tmp_path / "cloud"
    (run / "report").mkdir(parents=True)
    files = {"ledger.duckdb": b"\x00duck" * 100, "config.yaml": b"preset: cpu_tiny\n", "report/curve.csv": b"1,2\n"}
    for name, data in files.items():
        (run / name).write_bytes(data)
    (run / "queue.db").write_bytes(b"not archived")
    store = open_store(tmp_path / "store")
    keys = archive_run_dir(run, store)
    assert sorted(keys) == sorted(f"archive/cloud/{name}" for name in files)
    assert all(store.get_bytes(f"archive/cloud/{name}") == data for name, data in files.items())


@pytest.mark.parametrize("store", ["s3://", "/nonexistent/\0bad"])
def test_an_archive_the_store_refuses_exits_1_saying_so(store, tmp_path, capsys) -> None:
    from resources.run_archive import main as archive_main

    (tmp_path / "config.yaml").write_text("{}")
    assert archive_main(["--run-dir", str(tmp_path), "--store", store]) == 1
    assert "was not archived" in capsys.readouterr().err
