"""`spotlight launch` against SkyPilot's client SDK whose API server alone is faked: what it submits, in which order,
with which secrets, and when it stops (Redis silent, a refused password or certificate, a relaunch, the cap)."""

from __future__ import annotations

import json
import time

from tests.pipelines.sky_fakes import SECRETS, job, private_ip
from tests.pipelines.sky_fakes import invoke as _invoke
from tests.pipelines.sky_fakes import node_queue as _node_queue


def test_launch_starts_the_reserved_node_then_spot_jobs_pointed_at_its_redis(
    fake_sky, reserved_redis, monkeypatch
) -> None:
    """The node gets the password, the server's certificate and key as resolved secrets; each worker gets only the
    run's CA, its queue as the ACL user and that user's own password: never the coordinator's, never the key."""
    import base64
    from urllib.parse import urlsplit

    from resources.queue.redis_acl import worker_password, worker_users

    node = reserved_redis
    result = _invoke("launch", "--spot-workers", "2", "--gpu", "L4", "--store", "s3://b/p", "--max-usd", "50")
    assert result.exit_code == 0, result.output
    assert fake_sky.submitted == ["launch", "jobs.launch", "jobs.launch"]
    (reserved, cluster) = fake_sky.calls[0][1]
    assert cluster == "spotlight-reserved" and reserved.envs["MAX_USD"] == "50"
    served = {k: v.get_secret_value() for k, v in reserved.secrets.items()}
    assert served["SPOTLIGHT_REDIS_PASSWORD"] == node.password and not reserved.managed_secret_refs
    assert base64.b64decode(served["SPOTLIGHT_REDIS_TLS_KEY"]) == (node.folder / "server.key").read_bytes()
    ca = base64.b64decode(reserved.envs["SPOTLIGHT_REDIS_RUN_CA"])
    assert ca == (node.folder / "ca.pem").read_bytes() and "SPOTLIGHT_REDIS_PASSWORD" not in reserved.envs
    users = []
    for _, (task, name), _ in [c for c in fake_sky.calls if c[0] == "jobs.launch"]:
        users.append(user := urlsplit(task.envs["SPOTLIGHT_QUEUE"]).username)
        queue = f"rediss://{user}@{private_ip('spotlight-reserved')}:6379/0"  # the node's private address
        assert task.name == name and task.envs["SPOTLIGHT_QUEUE"] == queue
        assert base64.b64decode(task.envs["SPOTLIGHT_REDIS_RUN_CA"]) == ca
        assert {k: v.get_secret_value() for k, v in task.secrets.items()} == {
            **SECRETS,
            "SPOTLIGHT_REDIS_PASSWORD": worker_password(node.password, user),
            "SPOTLIGHT_REWARD_TOKEN": "",  # declared, empty: no remote reward in this run
        }
        assert node.password not in json.dumps(task.envs)
    with _node_queue(node, monkeypatch) as coordinator:  # each job's own user was granted before it was submitted
        assert sorted(worker_users(coordinator._redis)) == sorted(users) and len(set(users)) == 2
    assert node.password not in result.output
    assert f"rediss://{private_ip('spotlight-reserved')}:6379/0" in result.output


def test_the_reserved_node_goes_down_by_itself_once_its_run_block_has_ended(fake_sky, reserved_redis) -> None:
    """The node's autostop (from sky/reserved.yaml, so a launch by hand has it too): down, not stop, a few idle
    minutes after the run line exits (last iteration done or the spend cap reached); open SSH sessions do not
    keep it billing."""
    assert _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p").exit_code == 0
    (reserved, _), options = fake_sky.calls[0][1:]
    (resources,) = reserved.resources
    assert resources.autostop_config.enabled and resources.autostop_config.down
    assert 0 < resources.autostop_config.idle_minutes <= 15 and str(resources.autostop_config.wait_for.value) == "jobs"
    assert (
        options["idle_minutes_to_autostop"] is None and options["down"] is False
    )  # the YAML's setting is not overridden


def test_launch_waits_for_redis_and_submits_no_worker_when_it_never_answers(fake_sky, monkeypatch) -> None:
    import resources.cloud as cloud

    monkeypatch.setattr(cloud, "REDIS_WAIT_S", 0.3)
    fake_sky.address = "127.0.0.1:1"  # the node's setup failed: nothing listens
    started = time.monotonic()
    result = _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 1 and "did not answer within 0.3 s" in result.output, result.output
    assert "no spot workers submitted" in result.output and "sky logs spotlight-reserved" in result.output
    assert fake_sky.submitted == ["launch"] and time.monotonic() - started < 15


def test_launch_refuses_to_go_on_when_redis_refuses_the_password_or_its_certificate(
    fake_sky, reserved_redis, monkeypatch, tmp_path
) -> None:
    import shutil

    from resources.cloud import tls_folder

    shutil.rmtree(tls_folder("spotlight-reserved"))  # this machine lost the run's CA: a new one is made
    result = _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 1 and "presents a certificate the run's CA did not sign" in result.output
    assert fake_sky.submitted == ["launch"]
    fake_sky.calls.clear()
    (tls_folder("spotlight-reserved") / "ca.pem").write_bytes((reserved_redis.folder / "ca.pem").read_bytes())
    monkeypatch.setenv("SPOTLIGHT_REDIS_RUN_CA", "")
    monkeypatch.setenv("SPOTLIGHT_REDIS_PASSWORD", "not-the-password")
    result = _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 1 and "refused the password" in result.output and fake_sky.submitted == ["launch"]
    assert "not-the-password" not in result.output


def test_a_second_launch_resumes_the_run_and_submits_only_the_missing_workers(fake_sky, reserved_redis) -> None:
    fake_sky.jobs = [
        job("spotlight-reserved-rollout-1", 4, "RUNNING"),
        job("spotlight-reserved-rollout-2", 5, "FAILED"),
    ]
    result = _invoke("launch", "--spot-workers", "3", "--store", "s3://b/p")
    assert result.exit_code == 0, result.output
    assert [args[1] for name, args, _ in fake_sky.calls if name == "jobs.launch"] == [
        "spotlight-reserved-rollout-2",
        "spotlight-reserved-rollout-3",
    ]
    assert "spotlight-reserved-rollout-1 is already running (managed job 4, RUNNING)" in result.output


def test_a_relaunch_over_the_cap_starts_no_more_workers(fake_sky, reserved_redis, monkeypatch) -> None:
    with _node_queue(reserved_redis, monkeypatch) as queue:
        queue.publish_info({"usd_total": 51.5, "max_usd": 50.0})
    result = _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p", "--max-usd", "50")
    assert result.exit_code == 1 and "already spent $51.50" in result.output
    assert fake_sky.submitted == ["launch"]


def test_the_run_config_which_keeps_a_queue_url_as_given_is_readable_by_its_owner_only(tmp_path) -> None:
    from pipelines.run import resolve_run, save_run_config
    from resources.settings.resolve import CONFIG_NAME

    (tmp_path / CONFIG_NAME).write_text("{}")
    (tmp_path / CONFIG_NAME).chmod(0o644)  # written by hand, or by an older spotlight
    flags = {"queue": "redis://:pass-in-url-Q1@10.0.0.7:6379/0", "local_workers": 0}
    save_run_config(resolve_run(tmp_path, resume=False, flags=flags, replace=True).config)
    assert (tmp_path / CONFIG_NAME).stat().st_mode & 0o777 == 0o600
    assert "pass-in-url-Q1" in (tmp_path / CONFIG_NAME).read_text()  # kept for --resume, for its owner's eyes only


def test_a_relaunch_revokes_the_user_of_a_worker_job_that_ended_and_keeps_the_running_ones(
    fake_sky, reserved_redis, monkeypatch
) -> None:
    """A slot whose job failed gets a new job with a new user; the old job's user is revoked on the node (a job that
    ended keeps no credential), the running job's user stays."""
    from urllib.parse import urlsplit

    from resources.queue.redis_acl import worker_users

    assert _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p").exit_code == 0
    first = {
        name: urlsplit(task.envs["SPOTLIGHT_QUEUE"]).username
        for n, (task, name), _ in fake_sky.calls
        if n == "jobs.launch"
    }
    fake_sky.jobs = [
        job("spotlight-reserved-rollout-1", 4, "RUNNING"),
        job("spotlight-reserved-rollout-2", 5, "FAILED"),
    ]
    fake_sky.calls.clear()
    assert _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p").exit_code == 0
    ((task, name),) = [args for n, args, _ in fake_sky.calls if n == "jobs.launch"]
    replacement = urlsplit(task.envs["SPOTLIGHT_QUEUE"]).username
    assert name == "spotlight-reserved-rollout-2" and replacement != first[name]
    with _node_queue(reserved_redis, monkeypatch) as coordinator:
        granted = set(worker_users(coordinator._redis))
    assert granted == {first["spotlight-reserved-rollout-1"], replacement}


def test_a_public_queue_launch_reaches_its_mutual_tls_node_checks_the_cap_then_grants_and_submits(
    fake_sky, tmp_path, monkeypatch
) -> None:
    """With --public-queue the node's Redis asks every client for a certificate of the run's CA: the launcher shows
    the one it signs (its wait for Redis, the spend-cap check, the grants), and says how to follow the run."""
    import shutil

    import pytest

    import resources.cloud as cloud
    from resources.queue.redis_acl import worker_users
    from tests.pipelines.sky_fakes import start_node_redis, stop_node_redis

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    monkeypatch.setattr(cloud, "REDIS_WAIT_S", 5.0)  # a refused handshake fails in seconds, not 20 minutes
    monkeypatch.setenv("SPOTLIGHT_REDIS_PASSWORD", "public-node-pass-16")
    node = start_node_redis("spotlight-reserved", tmp_path / "node-redis", "public-node-pass-16", mutual_tls=True)
    fake_sky.address = f"127.0.0.1:{node.port}"  # the node's public endpoint
    flags = ("launch", "--spot-workers", "1", "--store", "s3://b/p", "--public-queue")
    try:
        with _node_queue(node, monkeypatch, client_cert=True) as queue:
            queue.publish_info({"usd_total": 51.5, "max_usd": 50.0})
            admin = queue._redis
            for name in ("SPOTLIGHT_REDIS_RUN_CA", "SPOTLIGHT_REDIS_CLIENT_CERT", "SPOTLIGHT_REDIS_CLIENT_KEY"):
                monkeypatch.setenv(name, "")  # a fresh shell: only the TLS files kept under the state folder
            over = _invoke(*flags, "--max-usd", "50")
            assert over.exit_code == 1 and "already spent $51.50" in over.output, over.output
            assert fake_sky.submitted == ["launch"]
            result = _invoke(*flags, "--max-usd", "80")
            assert result.exit_code == 0, result.output
            assert fake_sky.submitted == ["launch", "launch", "jobs.launch"] and len(worker_users(admin)) == 1
            assert "spotlight status --cluster spotlight-reserved --public-queue" in result.output
    finally:
        stop_node_redis(node)


def test_a_grant_the_nodes_redis_cannot_make_stops_the_launch_with_what_to_do(
    fake_sky, reserved_redis, monkeypatch
) -> None:
    """The node's Redis stops taking the launcher's password between its first answer and the first grant (its
    password changed there): the launch says so and submits no worker (no traceback); launching again resumes."""
    import pipelines.launch_cli as launch_cli
    from resources.queue.redis_streams import redis_client
    from resources.urls import redis_address

    def password_changed_on_the_node(url: str, max_usd: float) -> None:
        with redis_client(redis_address(url)) as admin:
            admin.execute_command("ACL", "SETUSER", "default", "resetpass", ">another-password-16")

    monkeypatch.setattr(launch_cli, "_refuse_over_budget", password_changed_on_the_node)
    result = _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert "could not grant spotlight-reserved-rollout-1's Redis user" in result.output
    assert "`spotlight launch` again resumes the run" in result.output and fake_sky.submitted == ["launch"]
