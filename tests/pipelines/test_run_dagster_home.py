"""`spotlight run` records on a persistent Dagster instance: what `dagster dev` shows after the run."""

from __future__ import annotations

import dagster as dg
import pytest
from typer.testing import CliRunner

from assets import FINAL_ASSETS, ITERATION_ASSETS
from assets.partitions import ITERATIONS, partition_key
from pipelines.cli import app
from pipelines.run_walk import INSTANCE_FOLDER, run_instance


def _materialized(instance: dg.DagsterInstance) -> set[tuple[str, str]]:
    """(asset, partition) of every materialization the instance holds."""
    out = set()
    for asset in ITERATION_ASSETS:
        for record in instance.fetch_materializations(asset.key, limit=100).records:
            out.add((asset.key.to_user_string(), record.asset_materialization.partition))
    return out


def _check_evaluations(instance: dg.DagsterInstance) -> dict[tuple[str, str], list]:
    """(asset, check) -> the evaluations the instance holds for that check."""
    out = {}
    for asset in ITERATION_ASSETS:
        for key in asset.check_keys:
            history = instance.event_log_storage.get_asset_check_execution_history(key, limit=100)
            out[(key.asset_key.to_user_string(), key.name)] = [r.evaluation for r in history]
    return out


@pytest.mark.slow  # a whole two-partition run, twice (resume)
def test_a_cli_run_leaves_every_materialization_and_check_on_dagster_home_and_resume_adds_to_it(
    tmp_path, monkeypatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    args = ["run", "--preset", "cpu_smoke", "--iterations", "1", "--rollouts", "inprocess"]
    args += ["--run-dir", str(tmp_path / "run")]
    done = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    assert f"DAGSTER_HOME={home} dagster dev -m pipelines.definitions" in done.output
    assert not (tmp_path / "run" / INSTANCE_FOLDER).exists()  # DAGSTER_HOME wins over the run folder

    with dg.DagsterInstance.get() as instance:
        assert set(instance.get_dynamic_partitions(ITERATIONS.name)) == {partition_key(0), partition_key(1)}
        expected = {(a.key.to_user_string(), partition_key(0)) for a in ITERATION_ASSETS}
        expected |= {(a.key.to_user_string(), partition_key(1)) for a in FINAL_ASSETS}
        assert _materialized(instance) == expected
        checks = _check_evaluations(instance)
        assert len(checks) == 4
        for (asset, check), evaluations in checks.items():
            runs = 2 if asset in {a.key.to_user_string() for a in FINAL_ASSETS} else 1
            assert len(evaluations) == runs, (asset, check)
            assert all(e is not None and e.passed for e in evaluations), (asset, check, evaluations)
        runs_before = len(instance.get_run_records())

    resumed = CliRunner().invoke(app, [*args, "--resume"], env={"COLUMNS": "300"})
    assert resumed.exit_code == 0, resumed.output
    assert resumed.output.count("done earlier (resumed)") == 2
    with dg.DagsterInstance.get() as instance:
        assert _materialized(instance) == expected
        assert len(instance.get_run_records()) == runs_before


def test_without_dagster_home_the_instance_lives_in_the_run_folder_and_persists(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    with run_instance(tmp_path) as instance:
        assert not instance.is_ephemeral
        instance.add_dynamic_partitions(ITERATIONS.name, [partition_key(0)])
    assert "telemetry" in (tmp_path / INSTANCE_FOLDER / "dagster.yaml").read_text()
    with dg.DagsterInstance.from_config(str(tmp_path / INSTANCE_FOLDER)) as reopened:  # as `dagster dev` opens it
        assert reopened.get_dynamic_partitions(ITERATIONS.name) == [partition_key(0)]


def test_a_relative_dagster_home_is_refused_before_the_run_starts(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DAGSTER_HOME", "relative/home")
    args = ["run", "--preset", "cpu_smoke", "--rollouts", "inprocess", "--run-dir", str(tmp_path / "run")]
    done = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert done.exit_code != 0
    assert "DAGSTER_HOME must be an absolute path" in done.output + str(done.exception)
    assert not (tmp_path / "run" / "ledger.duckdb").exists()
