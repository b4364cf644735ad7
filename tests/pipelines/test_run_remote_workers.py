"""`spotlight run --workers 0`: a coordinator without local workers, for a Redis queue whose remote (SkyPilot spot)
workers sample everything, as the reserved node of a `--model` run does (its CPU cannot sample a real model)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.run import RunSpec


def test_no_local_workers_is_for_a_redis_queue_only(tmp_path):
    spec = RunSpec(str(tmp_path / "run"), queue="redis://10.0.0.7:6379/0", num_workers=0)
    assert spec.num_workers == 0
    with pytest.raises(ValueError, match="0 only on a Redis --queue"):
        RunSpec(str(tmp_path / "run"), num_workers=0)  # a SQLite queue: nobody would ever sample
    done = CliRunner().invoke(
        app, ["run", "--workers", "0", "--run-dir", str(tmp_path / "cli")], env={"COLUMNS": "400"}
    )
    assert done.exit_code == 2 and "0 only on a Redis --queue" in done.output
    assert not (tmp_path / "cli").exists()
