"""The iteration assets materialized in-process with the real local resources (store folder, DuckDB, SQLite)."""

from __future__ import annotations

import pytest

from tests.paths import REPO_ROOT


@pytest.fixture
def tiny_run(tmp_path, tiny_policy):
    """Resources of a 2-iteration cpu_smoke run on the tiny policy, in a fresh run folder."""
    import torch

    from tests.runs import run_resources
    from workers.model.tiny_policy import save_policy

    torch.set_num_threads(1)
    save_policy(tiny_policy, tmp_path / "tiny")
    return run_resources(
        tmp_path / "run", "inprocess", run="t", preset="cpu_smoke", iterations=2, checkpoint=str(tmp_path / "tiny")
    )


def test_two_iterations_fill_store_ledger_and_metadata(tiny_run, tmp_path):
    import dagster as dg

    from pipelines.run_walk import walk_iterations
    from resources.keys import patch_key, rollouts_prefix, seed_plan_key, weights_key

    outcomes = list(walk_iterations(dg.DagsterInstance.ephemeral(), tiny_run))
    assert [o.iteration for o in outcomes] == [0, 1, 2] and not any(o.skipped for o in outcomes)

    store = tiny_run["store"].get_store()
    for v in (0, 1, 2):
        assert store.read_manifest(weights_key("t", v)) is not None
    for v in (1, 2):
        assert store.read_manifest(patch_key("t", v)) is not None
    assert (
        len(store.list_commits(rollouts_prefix("t", 0))) == 8 and len(store.list_commits(rollouts_prefix("t", 1))) == 8
    )
    assert store.read_manifest(seed_plan_key("t", 2)) is not None

    ledger = tiny_run["ledger"].get_ledger()
    assert ledger.query("SELECT iteration, status FROM iterations ORDER BY 1").rows == [
        (0, "succeeded"),
        (1, "succeeded"),
        (2, "succeeded"),
    ]
    assert ledger.query("SELECT status FROM runs WHERE run_id = 't'").rows == [("succeeded",)]
    assert ledger.query("SELECT iteration, count(*) FROM requests GROUP BY 1 ORDER BY 1").rows == [(0, 8), (1, 8)]
    assert ledger.query("SELECT weights_version FROM validation ORDER BY 1").rows == [(0,), (1,), (2,)]
    assert ledger.query("SELECT version, kind FROM syncs ORDER BY 1").rows == [
        (0, "anchor"),
        (1, "patch"),
        (2, "patch"),
    ]
    assert ledger.query("SELECT count(*) FROM train_steps").rows == [(2,)]
    phases = {r[0] for r in ledger.query("SELECT DISTINCT phase FROM phases").rows}
    assert phases == {"sync", "rollout", "train", "validate"}
    assert ledger.query("SELECT count(*) FROM cost_per_iteration WHERE usd_reserved > 0").rows == [(3,)]

    meta = outcomes[1].metadata
    assert meta["weight_patch"]["sent_bytes"] < meta["weight_patch"]["dense_bytes"]
    assert meta["rollouts"]["num_requests"] == 8 and "data:image/png;base64," in meta["rollouts"]["samples"]
    assert meta["policy_update"]["weights_version_out"] == 2
    assert 0.0 <= meta["validation"]["score"] <= 1.0 and meta["validation"]["phase_usd"] > 0
    assert set(outcomes[2].metadata) == {"weight_patch", "validation", "report"}  # the final partition
    report = tmp_path / "run" / "report"
    assert (report / "index.html").is_file() and (report / "grids" / "it-000001-rollouts.png").is_file()
    assert "<table>" in (report / "index.html").read_text()


def test_asset_checks_pass_on_a_healthy_iteration(tiny_run):
    import dagster as dg

    from pipelines.run_walk import materialize_iteration

    result = materialize_iteration(dg.DagsterInstance.ephemeral(), tiny_run, 0)
    checks = {
        e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data.passed
        for e in result.all_events
        if e.event_type_value == "ASSET_CHECK_EVALUATION"
    }
    assert checks == {
        "patch_reproduces_trainer_hash": True,
        "rewards_finite": True,
        "validation_not_below_guard": True,
        "no_reward_hacking": True,
    }


def test_a_later_iteration_without_its_predecessor_fails_with_what_to_run(tiny_run):
    import dagster as dg

    from pipelines.run_walk import materialize_iteration

    result = materialize_iteration(dg.DagsterInstance.ephemeral(), tiny_run, 1)
    assert not result.success
    failures = [e for e in result.all_events if e.is_step_failure]
    assert "policy_update" in str(failures[0].step_failure_data.error)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("preset", "huge", "unknown preset 'huge'"),
        ("reward", "aesthetics", "unknown reward 'aesthetics'"),
        ("store", "ftp://host/x", "unsupported store URL scheme 'ftp'"),
        ("queue", "amqp://host", "unsupported queue URL scheme 'amqp'"),
        ("rollouts", "magic", "deployment.rollouts: Input should be 'local_pool', 'inprocess'"),
        ("deployment", "mars", "deployment.deployment: Input should be 'local' or 'cloud'"),
    ],
)
def test_bad_configuration_fails_at_load_with_the_allowed_values(tmp_path, field, value, message):
    from tests.runs import run_resources

    with pytest.raises(ValueError, match=message):
        run_resources(tmp_path, **{field: value})


def test_definitions_load_from_the_environment_and_refuse_a_bad_one(tmp_path):
    import subprocess
    import sys

    root = REPO_ROOT
    env = {"SPOTLIGHT_RUN_DIR": str(tmp_path), "SPOTLIGHT_PRESET": "nope", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", "import pipelines.definitions"], cwd=root, env=env, capture_output=True, text=True
    )
    assert proc.returncode != 0 and "unknown preset 'nope'" in proc.stderr


@pytest.mark.slow  # a worker process and a Dagster run: about 20 CPU-seconds, 70 s on the loaded 2-core dev VM
def test_a_queue_password_in_the_url_reaches_no_ledger_store_log_or_worker_command_line(
    tmp_path, tiny_policy, redis_server, monkeypatch, capfd
):
    """Iteration 0 of a cpu_smoke run whose rollouts go through Redis to a local worker process, the password
    given in the queue URL: the ledger, store, worker logs, Dagster's event log, this process's output and the
    worker's argv (what `ps` shows every user) must not hold it."""
    import subprocess

    import dagster as dg
    import torch

    import resources.cluster
    from pipelines.run_walk import materialize_iteration, run_instance
    from resources.queue.base import PASSWORD_ENV
    from tests.runs import run_resources
    from workers.model.tiny_policy import save_policy

    monkeypatch.delenv(PASSWORD_ENV, raising=False)  # the URL is the only place the password is given
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    redis_server.flush()
    commands = []

    class RecordingPopen(subprocess.Popen):
        def __init__(self, args, *rest, **kwargs):
            commands.append(list(args))
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(resources.cluster.subprocess, "Popen", RecordingPopen)
    torch.set_num_threads(1)
    save_policy(tiny_policy, tmp_path / "tiny")
    run_dir = tmp_path / "run"
    secret = redis_server.password
    run = run_resources(
        run_dir,
        "local_cluster",
        run="t",
        preset="cpu_smoke",
        iterations=1,
        checkpoint=str(tmp_path / "tiny"),
        queue=redis_server.url(secret),
        local_workers=1,
        preemptions_per_hour=0.0,
    )
    instance = run_instance(run_dir)  # what `spotlight run` records on (the run folder's own, on disk)
    result = materialize_iteration(instance, run, 0)
    assert result.success
    snapshot = instance.get_job_snapshot(instance.get_run_by_id(result.run_id).job_snapshot_id)
    assert secret not in dg.serialize_value(snapshot)  # it holds every resource's config; the queue URL by name
    ledger = run["ledger"].get_ledger()
    assert ledger.query("SELECT queue_url FROM runs").rows == [(f"redis://127.0.0.1:{redis_server.port}/0",)]
    assert ledger.query("SELECT worker_id, count(*) FROM requests GROUP BY 1").rows == [("it0w0.0", 8)]  # via Redis
    ledger.close()

    assert commands and all(secret not in " ".join(map(str, c)) for c in commands), commands
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"ledger.duckdb"} and any(p.parent.name == "worker_logs" for p in files)
    assert [p for p in files if secret.encode() in p.read_bytes()] == []
    assert [r for r in instance.all_logs(result.run_id) if secret in str(r)] == []
    out, err = capfd.readouterr()
    assert secret not in out + err
    instance.dispose()


def test_sensor_requests_the_next_iteration_then_the_final_one_then_stops():
    from pipelines.sensors import next_iteration_request

    key, request = next_iteration_request("demo", "it-000000", target=2)
    assert key == "it-000001" and request.run_key == "demo/it-000001" and request.asset_selection is None
    key, request = next_iteration_request("demo", "it-000001", target=2)
    assert key == "it-000002" and {k.to_user_string() for k in request.asset_selection} == {
        "weight_patch",
        "validation",
        "report",
    }
    assert next_iteration_request("demo", "it-000002", target=2) is None


def test_the_phases_sample_with_the_worker_knobs_of_the_run_config(tmp_path):
    """The rollout phases read Sampling, made from the run's workers section: a knob set once reaches it."""
    from tests.runs import run_resources

    run_config = run_resources(tmp_path, "local_cluster", preset="cpu_smoke", lease_s=7.0, commit_every=3)["run_config"]
    sampling = run_config.sampling
    assert (sampling.mode, sampling.lease_s, sampling.commit_every) == ("local_cluster", 7.0, 3)
    assert sampling.log_dir == str(tmp_path / "worker_logs")
