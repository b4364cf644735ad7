"""`spotlight launch --print-env`: the YAMLs by hand. The printed `sky launch` / `sky jobs launch` lines are parsed by
SkyPilot's own CLI (its click commands, --env-file / --secret-file / --config / --infra handling and YAML loading),
then served (YAML round trip, secret resolution), and must give the tasks `spotlight launch` itself submits."""

from __future__ import annotations

import os
import shlex
import stat

import pytest

from tests.pipelines.sky_fakes import SECRETS, served_task
from tests.pipelines.sky_fakes import invoke as _invoke

FLAGS = ("--spot-workers", "2", "--store", "s3://b/p", "--gpu", "A10G", "--no-env-cache")
TOKEN = "reward-tok-'\\ 9"  # a quote and a backslash survive the files


def sky_cli_task(line: str, monkeypatch):
    """The task SkyPilot's CLI builds from one printed command line (before it calls its SDK), and the SkyPilot
    config its --config flags set."""
    from sky.client.cli import command

    from sky import skypilot_config

    argv = shlex.split(line)
    jobs = argv[1:3] == ["jobs", "launch"]
    click_command, args = (command.jobs_launch, argv[3:]) if jobs else (command.launch, argv[2:])
    applied: dict = {}
    monkeypatch.setattr(  # SkyPilot's own parser of --config, without touching this process's loaded config
        skypilot_config, "apply_cli_config", lambda value: applied.update(skypilot_config._compose_cli_config(value))
    )
    params = click_command.make_context("sky", args).params
    env = command._merge_cli_and_file_vars([params["env_file"]], params["env"])
    secret = command._merge_cli_and_file_vars([params["env_file"], params["secret_file"]], params["secret"])
    cloud, region, zone = command._handle_infra_cloud_region_zone_options(params["infra"], None, None, None)
    task = command._make_task_or_dag_from_entrypoint_with_overrides(
        params["entrypoint"],
        name=params["name"] if jobs else None,
        cloud=cloud,
        region=region,
        zone=zone,
        gpus=params["gpus"],
        ports=params["ports"],
        env=env,
        secret=secret,
    )
    return task, applied, (params["cluster"] if not jobs else params["name"])


def _served_by_hand(output: str, monkeypatch) -> dict:
    """Each printed `sky` line as SkyPilot's CLI builds and its API server serves it: name -> (task, config set by
    its --config flags); each line's --env-file and --secret-file are this user's only (0600)."""
    by_hand = {}
    for line in (line for line in output.splitlines() if line.startswith("sky ")):
        task, config, name = sky_cli_task(line, monkeypatch)
        by_hand[name] = (served_task(task), config)
        for flag in ("--env-file", "--secret-file"):
            path = shlex.split(line)[shlex.split(line).index(flag) + 1]
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    return by_hand


def test_print_env_gives_skypilots_cli_the_tasks_launch_submits_and_no_secret_on_a_command_line(
    fake_sky, reserved_redis, monkeypatch
) -> None:
    """Each printed line, parsed by SkyPilot's CLI, gives the task launch submits (each worker job as its own ACL
    user, so only the user's name differs); the printed grant line, run against the node's Redis as printed, lets
    each worker log in with the password its secret file holds."""
    from urllib.parse import urlsplit

    from resources.queue.redis_acl import main as redis_acl
    from resources.queue.redis_acl import worker_password

    monkeypatch.setenv("SPOTLIGHT_REWARD_TOKEN", TOKEN)
    printed = _invoke("launch", *FLAGS, "--print-env")
    assert printed.exit_code == 0, printed.output
    assert not fake_sky.submitted  # nothing launched
    for secret in (reserved_redis.password, SECRETS["AWS_SECRET_ACCESS_KEY"], TOKEN, "PRIVATE KEY"):
        assert secret not in printed.output
    by_hand = _served_by_hand(printed.output, monkeypatch)
    assert len(by_hand) == 3  # the reserved node, then one managed job per spot worker
    users = {
        name: urlsplit(hand.envs["SPOTLIGHT_QUEUE"]).username
        for name, (hand, _) in by_hand.items()
        if "-rollout-" in name
    }
    (grant,) = [shlex.split(line) for line in printed.output.splitlines() if " resources.queue.redis_acl " in line]
    assert grant[-len(users) - 1 :] == ["grant", *users.values()] and len(set(users.values())) == 2
    monkeypatch.setenv("SPOTLIGHT_REDIS_RUN_CA", "")
    launched = _invoke("launch", *FLAGS)
    assert launched.exit_code == 0, launched.output
    for index, (_, (task, name), _) in enumerate(fake_sky.calls):
        hand, config = by_hand[name]
        assert hand.name == task.name or name == "spotlight-reserved"
        user = users.get(name)
        launch_user = urlsplit(task.envs.get("SPOTLIGHT_QUEUE", "")).username
        assert hand.envs == {
            **task.envs,
            **({"SPOTLIGHT_QUEUE": task.envs["SPOTLIGHT_QUEUE"].replace(launch_user, user)} if user else {}),
        }
        # SkyPilot's CLI also passes the --env-file's values as secrets (the same values): the secret file's are these
        expected = {k: v.get_secret_value() for k, v in task.secrets.items()}
        if user:
            expected["SPOTLIGHT_REDIS_PASSWORD"] = worker_password(reserved_redis.password, user)
        assert {k: v.get_secret_value() for k, v in hand.secrets.items() if k not in hand.envs} == expected
        assert hand.secrets["SPOTLIGHT_REWARD_TOKEN"].get_secret_value() == TOKEN
        assert hand.file_mounts == task.file_mounts  # the run's config file, copied to ~/.spotlight/run_config.yaml
        assert {str(r) for r in hand.resources} == {str(r) for r in task.resources}
        assert {(r.region, tuple(r.ports or ())) for r in hand.resources} == {
            (r.region, tuple(r.ports or ())) for r in task.resources
        }
        assert config.get("aws", {}).get("security_group_name") == fake_sky.security_groups[index]
        assert not hand.managed_secret_refs
    # The grant line as printed, through the tunnel (here: the node's Redis on its test port), as the coordinator.
    from resources.cloud import use_run_ca

    monkeypatch.setenv("SPOTLIGHT_REDIS_RUN_CA", "")
    assert use_run_ca("spotlight-reserved")  # the launcher trusts the run's CA from its state folder
    assert redis_acl(["--queue", reserved_redis.url(), *grant[grant.index("--queue") + 2 :]]) == 0
    for name, user in users.items():
        hand, _ = by_hand[name]
        assert _can_ping(
            reserved_redis.url(user), hand.secrets["SPOTLIGHT_REDIS_PASSWORD"].get_secret_value(), monkeypatch
        )


def _can_ping(url: str, password: str, monkeypatch) -> bool:
    """Whether a worker logs in to `url` with `password` (the run's CA from the environment) and gets PONG."""
    from resources.queue.redis_streams import redis_client
    from resources.urls import redis_address

    monkeypatch.setenv("SPOTLIGHT_REDIS_PASSWORD", password)
    client = redis_client(redis_address(url), socket_connect_timeout=10)
    try:
        return bool(client.ping())
    finally:
        client.close()


def test_print_env_before_the_node_is_up_prints_its_command_and_says_to_come_back_for_the_workers(fake_sky) -> None:
    fake_sky.cluster_exists = False
    printed = _invoke("launch", *FLAGS, "--print-env")
    assert printed.exit_code == 0, printed.output
    commands = [line for line in printed.output.splitlines() if line.startswith("sky ")]
    assert len(commands) == 1 and commands[0].startswith("sky launch -y -c spotlight-reserved ")
    assert "run this again once `sky status spotlight-reserved` shows the node UP" in printed.output


def test_print_env_without_the_redis_password_is_refused(fake_sky, monkeypatch) -> None:
    monkeypatch.delenv("SPOTLIGHT_REDIS_PASSWORD")
    printed = _invoke("launch", *FLAGS, "--print-env")
    assert printed.exit_code == 1 and "SPOTLIGHT_REDIS_PASSWORD" in printed.output and not fake_sky.calls


@pytest.mark.parametrize("name", ["reserved.yaml", "spot_workers.yaml"])
def test_each_yaml_header_tells_how_to_run_it_by_hand_with_print_env(name) -> None:
    from tests.paths import REPO_ROOT

    header = (REPO_ROOT / "sky" / name).read_text().split("\nname:")[0]
    assert "--print-env" in header and "--env-file" in header and "--secret-file" in header


def test_print_env_of_a_public_queue_has_the_grant_line_show_the_workers_client_certificate(tmp_path) -> None:
    """A public queue's node asks every client for a certificate of the run's CA (mutual TLS), the coordinator's
    grant included: the printed step says which variables it needs, and each worker's secret file holds them."""
    import sky
    from resources.cloud import NodePlace, with_run_tls
    from resources.cloud.by_hand import by_hand_commands
    from resources.queue.redis_tls import make_run_tls
    from tests.pipelines.sky_fakes import launch_plan

    plan = launch_plan(spot_workers=1, public_queue=True)
    place = NodePlace(sky.AWS(), "us-east-2", "10.0.0.7", "3.80.1.2")
    lines = by_hand_commands(plan, with_run_tls(SECRETS, make_run_tls()), tmp_path, place, "3.80.1.2:6379")
    (step,) = [line for line in lines if line.startswith("# 2. grant")]
    assert "SPOTLIGHT_REDIS_CLIENT_CERT" in step and "SPOTLIGHT_REDIS_CLIENT_KEY" in step
    secrets = (tmp_path / "worker-1.secrets").read_text()
    assert "SPOTLIGHT_REDIS_CLIENT_CERT=" in secrets and "SPOTLIGHT_REDIS_CLIENT_KEY=" in secrets
