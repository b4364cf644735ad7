"""`SPOTLIGHT_DEPLOYMENT=cloud`: what `dagster dev` loads on the reserved node. The definitions wire an S3 tensor store,
a Redis queue and spot workers that pull from it; without an S3 store or a Redis queue they refuse to load, saying
which variable to set."""

from __future__ import annotations

import importlib
import sys

import dagster as dg
import pytest
import torch

from resources.queue.redis_streams import RedisQueue
from resources.store.s3 import S3TensorStore

PASSWORD_IN_ENV = "SPOTLIGHT_REDIS_PASSWORD"


@pytest.fixture
def load_definitions(monkeypatch: pytest.MonkeyPatch):
    """pipelines.definitions imported afresh under an environment (the module reads it once, when it loads); the
    module loaded before, if any, is put back afterwards, so later tests see the local deployment again."""
    import pipelines

    name = "pipelines.definitions"
    saved = sys.modules.pop(name, None)

    def load(env: dict[str, str]):
        for variable, value in env.items():
            monkeypatch.setenv(variable, value)
        sys.modules.pop(name, None)
        return importlib.import_module(name).defs

    yield load
    sys.modules.pop(name, None)
    if saved is None:
        vars(pipelines).pop("definitions", None)
    else:
        sys.modules[name] = pipelines.definitions = saved


@pytest.fixture
def cloud_env(s3_server, redis_server, tmp_path) -> dict[str, str]:
    return {
        "SPOTLIGHT_DEPLOYMENT": "cloud",
        "SPOTLIGHT_RUN": "cloud-run",
        "SPOTLIGHT_RUN_DIR": str(tmp_path / "node"),
        "SPOTLIGHT_PRESET": "cpu_smoke",
        "SPOTLIGHT_STORE": f"s3://{s3_server.bucket}/spotlight",
        "SPOTLIGHT_QUEUE": f"redis://127.0.0.1:{redis_server.port}/3",
        PASSWORD_IN_ENV: redis_server.password,
    }


def test_cloud_definitions_wire_s3_redis_and_pulling_spot_workers(load_definitions, cloud_env, s3_server, redis_server):
    defs = load_definitions(cloud_env)
    resources = defs.resources
    assert set(resources) == {"run_config", "store", "queue", "ledger"}
    # Spot workers launched by SkyPilot pull the rollouts; the coordinator enqueues and waits.
    from pipelines.deploy import resources_from_env

    run_config = resources_from_env(cloud_env)["run_config"]
    assert run_config.sampling.mode == "workers"
    assert run_config.run == "cloud-run" and run_config.preset == "cpu_smoke"
    assert resources["ledger"].path == f"{cloud_env['SPOTLIGHT_RUN_DIR']}/ledger.duckdb"  # on the reserved node
    assert defs.resolve_job_def("iteration") is not None and defs.resolve_sensor_def("next_iteration") is not None

    # Store and queue come as the variables' names, resolved when a run launches (build_resources does the same).
    assert (resources["store"].url, resources["queue"].url) == (
        dg.EnvVar("SPOTLIGHT_STORE"),
        dg.EnvVar("SPOTLIGHT_QUEUE"),
    )
    with dg.build_resources({"store": resources["store"], "queue": resources["queue"]}) as live:
        _check_store_and_queue(live, cloud_env, s3_server, redis_server)


def _check_store_and_queue(live, cloud_env, s3_server, redis_server) -> None:
    # The store is S3 on the moto endpoint (from AWS_ENDPOINT_URL): a publish lands in the bucket under the prefix.
    store = live.store.get_store()
    assert isinstance(store, S3TensorStore) and store.url == f"s3://{s3_server.bucket}/spotlight"
    weights = {"w": torch.arange(6, dtype=torch.float32)}
    store.publish_tensors("runs/cloud-run/check", weights)
    listed = s3_server.client().list_objects_v2(Bucket=s3_server.bucket, Prefix="spotlight/runs/cloud-run/check")
    assert listed["KeyCount"] >= 2  # the tensors, then their manifest
    assert torch.equal(store.load_tensors("runs/cloud-run/check")["w"], weights["w"])

    # The queue is Redis, its password from the environment (never in the URL the ledger and Dagster keep).
    redis_server.flush()
    with live.queue.get_queue() as queue:
        assert isinstance(queue, RedisQueue)
        assert redis_server.password not in queue.url and live.queue.url == cloud_env["SPOTLIGHT_QUEUE"]
        assert queue.put([{"request_id": "cloud-r0", "iteration": 0, "kind": "rollout", "payload": {}}]) == 1
        lease = queue.claim("spot-0", lease_s=30)
        assert lease is not None and lease.request_id == "cloud-r0"
        assert queue.ack(lease, "results/cloud-r0")
        assert queue.states(["cloud-r0"]) == {"cloud-r0": "done"}


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SPOTLIGHT_STORE": None}, "the cloud deployment needs SPOTLIGHT_STORE=s3://bucket/prefix (got None)"),
        ({"SPOTLIGHT_STORE": "/data/store"}, "needs SPOTLIGHT_STORE=s3://bucket/prefix (got '/data/store')"),
        ({"SPOTLIGHT_QUEUE": None}, "the cloud deployment needs SPOTLIGHT_QUEUE=redis://host:port/db or rediss://"),
        ({"SPOTLIGHT_QUEUE": "/data/queue.db"}, "needs SPOTLIGHT_QUEUE=redis://host:port/db"),
        (
            {"SPOTLIGHT_ROLLOUTS": "teleport"},
            "SPOTLIGHT_ROLLOUTS: deployment.rollouts: Input should be 'local_pool', 'inprocess'",
        ),
    ],
)
def test_cloud_definitions_refuse_to_load_without_an_s3_store_or_a_redis_queue(
    load_definitions, monkeypatch, tmp_path, change, message
):
    from pipelines.deploy import DeploymentError

    env = {
        "SPOTLIGHT_DEPLOYMENT": "cloud",
        "SPOTLIGHT_RUN_DIR": str(tmp_path),
        "SPOTLIGHT_STORE": "s3://bucket/prefix",
        "SPOTLIGHT_QUEUE": "redis://reserved:6379/0",
    }
    for name, value in change.items():
        env.pop(name, None)
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            env[name] = value
    with pytest.raises(DeploymentError) as raised:
        load_definitions(env)
    assert message in str(raised.value)
    assert not (tmp_path / "ledger.duckdb").exists()  # refused before anything was written
