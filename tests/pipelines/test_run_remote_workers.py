"""`spotlight run --workers 0`: a coordinator without local workers, for a Redis queue whose remote (SkyPilot spot)
workers sample everything, as the reserved node of a `--model` run does (its CPU cannot sample a real model)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.run import resolve_run


def test_no_local_workers_is_for_a_redis_queue_only(tmp_path):
    flags = {"queue": "redis://10.0.0.7:6379/0", "local_workers": 0}
    assert resolve_run(tmp_path / "run", resume=False, flags=flags).config.workers.local_workers == 0
    with pytest.raises(ValueError, match="0 only on a Redis deployment.queue"):
        resolve_run(tmp_path / "run", resume=False, flags={"local_workers": 0})  # SQLite: nobody would ever sample
    done = CliRunner().invoke(
        app, ["run", "--local-workers", "0", "--run-dir", str(tmp_path / "cli")], env={"COLUMNS": "400"}
    )
    assert done.exit_code == 2 and "0 only on a Redis deployment.queue" in " ".join(done.output.split())
    assert not (tmp_path / "cli").exists()
