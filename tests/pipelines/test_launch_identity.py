"""`spotlight launch --aws-identity`: with an instance role the nodes reach S3 without AWS keys. No task carries the
keys (checked through SkyPilot's YAML round trip and secret resolution), and every launch request carries SkyPilot's
`aws.remote_identity` to its API server."""

from __future__ import annotations

import json

import pytest

from tests.pipelines.sky_fakes import PASSWORD, SECRETS, launch_plan, served_task, skypilot_config
from tests.pipelines.sky_fakes import invoke as _invoke

AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@pytest.mark.parametrize("identity", ["role:spotlight-nodes", "service-account"])
def test_with_an_instance_role_no_task_declares_or_carries_the_aws_keys(identity, tmp_path) -> None:
    from resources.cloud import plan_tasks, ship_run_config, with_run_tls
    from resources.queue.redis_tls import make_run_tls

    plan = launch_plan(spot_workers=2, aws_identity=identity)
    secrets = with_run_tls({"SPOTLIGHT_REDIS_PASSWORD": PASSWORD}, make_run_tls())
    for task in plan_tasks(plan, secrets, ship_run_config(plan, tmp_path), "rediss://w@10.0.0.7:6379/0"):
        served = served_task(task)  # SkyPilot's round trip and secret resolution accept it: nothing left unresolved
        assert not set(AWS_KEYS) & (set(served.secrets) | set(served.envs)) and not served.managed_secret_refs
        assert "SPOTLIGHT_REDIS_PASSWORD" in served.secrets
        assert not any(key in json.dumps(task.to_yaml_config(), default=str) for key in AWS_KEYS)


def test_launch_with_a_role_needs_no_aws_keys_and_every_request_carries_the_remote_identity(
    fake_sky, reserved_redis, monkeypatch
) -> None:
    for key in AWS_KEYS:
        monkeypatch.delenv(key)
    refused = _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p")  # the default ships keys: they are needed
    assert refused.exit_code == 1 and "AWS_ACCESS_KEY_ID" in refused.output and "--aws-identity" in refused.output
    result = _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p", "--aws-identity", "role:spotlight-nodes")
    assert result.exit_code == 0, result.output
    assert fake_sky.submitted == ["launch", "jobs.launch", "jobs.launch"]
    assert fake_sky.identities == [
        ("sky.client.sdk", "spotlight-nodes"),
        ("sky.jobs.client.sdk", "spotlight-nodes"),
        ("sky.jobs.client.sdk", "spotlight-nodes"),
    ]
    for _, (task, _), _ in fake_sky.calls:
        assert not set(AWS_KEYS) & set(task.secrets) and not task.managed_secret_refs


def test_the_default_ships_the_keys_only_where_skypilots_config_chose_local_credentials(fake_sky, reserved_redis):
    assert _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p").exit_code == 0  # fake_sky's config
    assert [identity for _, identity in fake_sky.identities] == ["LOCAL_CREDENTIALS"] * 2
    for _, (task, _), _ in fake_sky.calls:
        assert {k: task.secrets[k].get_secret_value() for k in AWS_KEYS} == {k: SECRETS[k] for k in AWS_KEYS}


def test_the_default_takes_the_instance_role_skypilots_config_names(fake_sky, reserved_redis) -> None:
    with skypilot_config(remote_identity="spotlight-nodes"):
        result = _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p")
    assert result.exit_code == 0, result.output
    assert [identity for _, identity in fake_sky.identities] == ["spotlight-nodes"] * 2
    for _, (task, _), _ in fake_sky.calls:
        assert not set(AWS_KEYS) & set(task.secrets)


def test_the_default_with_no_identity_configured_is_refused_keys_only_by_choice(fake_sky) -> None:
    with skypilot_config(remote_identity=None):
        result = _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p")
        chosen = _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p", "--aws-identity", "keys", "--dry-run")
    assert result.exit_code == 2 and "no instance role is configured" in result.output and not fake_sky.calls
    assert "role:PROFILE" in result.output and "keys (this machine's AWS keys" in result.output
    assert chosen.exit_code == 0, chosen.output


@pytest.mark.parametrize("identity", ["role:", "role:bad name", "iam", "keys:x"])
def test_an_identity_it_cannot_use_is_refused_before_anything_is_submitted(fake_sky, identity) -> None:
    result = _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p", "--aws-identity", identity)
    assert result.exit_code == 2 and "--aws-identity must be one of" in result.output and not fake_sky.calls
