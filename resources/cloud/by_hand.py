"""`spotlight launch --print-env`: the same launch run by hand with SkyPilot's own CLI, sky/*.yaml as they are.

For each task it writes, in the run's state folder (0700, files 0600), an `--env-file` (the envs `launch` sets,
RUN_CONFIG_FILE naming the run's config file, which the YAMLs' file_mounts copy to every node) and a `--secret-file`
(the secrets: never on a command line, where `ps` shows them to every user of the machine), and returns the `sky
launch` / `sky jobs launch` commands that use them (each worker job its own files: its own ACL user, granted on the
node first by the printed `redis_acl grant` line), with the SkyPilot config keys the launch would set (`--config`)
and the resources it would change (`--gpus`, `--ports`, `--infra`). The spot workers' commands need the reserved
node's private address, cloud and region: given once it is up (`place`), else a line says to run it again then.

Not expressible on SkyPilot's command line, and so left out (a line says so): the env-cache bucket mount (the nodes
then install their venv) and --model-source's mount (add it to both YAMLs' file_mounts).

Example:
    lines = by_hand_commands(plan, secrets, run_config_folder(plan.cluster), node_place_or_none)
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit

import sky
from resources.cloud.jobs import worker_job_name
from resources.cloud.network import REDIS_PORT, NodePlace, skypilot_config_overrides
from resources.cloud.plan import LaunchPlan
from resources.cloud.tasks import NODE_QUEUE, SKY_DIR, reserved_task, ship_run_config, worker_task
from resources.urls import CLIENT_CERT_ENV, CLIENT_KEY_ENV, PASSWORD_ENV, RUN_CA_ENV


def dotenv_text(values: Mapping[str, str]) -> str:
    """`NAME='value'` lines that python-dotenv (SkyPilot's --env-file / --secret-file parser) reads back exactly."""
    quoted = {name: value.replace("\\", "\\\\").replace("'", "\\'") for name, value in values.items()}
    return "".join(f"{name}='{value}'\n" for name, value in quoted.items())


def write_private(path: Path, text: str) -> Path:
    """Write `text` to `path`, readable by this user only (made 0600 before anything is written)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an older file of other permissions
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


def _task_files(task: sky.Task, folder: Path, stem: str) -> tuple[Path, Path]:
    """The task's envs (RUN_CONFIG_FILE naming the run's config file) and secrets (those with a value) as its env
    file and secret file."""
    envs = {k: str(v) for k, v in task.envs.items()}
    secrets = {k: v.get_secret_value() for k, v in task.secrets.items() if v.get_secret_value()}
    return (
        write_private(folder / f"{stem}.env", dotenv_text(envs)),
        write_private(folder / f"{stem}.secrets", dotenv_text(secrets)),
    )


def _config_flags(plan: LaunchPlan) -> list[str]:
    """`--config KEY=VALUE` for each SkyPilot config key the launch sets (identity, the run's security group)."""
    flags = []
    for cloud, keys in skypilot_config_overrides(plan).items():
        for key, value in keys.items():
            flags += ["--config", f"{cloud}.{key}={value}"]
    return flags


def by_hand_commands(
    plan: LaunchPlan, secrets: Mapping[str, str], folder: Path, place: NodePlace | None, queue_host: str | None = None
) -> list[str]:
    """Write the files to `folder` and return the lines to print: comments and the `sky` commands (paths quoted)."""
    hand = dataclasses.replace(plan, env_cache=False, model_source=None)  # mounts the CLI cannot add
    run_config = ship_run_config(hand, folder)
    reserved = reserved_task(hand, secrets, run_config)
    env_file, secret_file = _task_files(reserved, folder, "reserved")
    command = ["sky", "launch", "-y", "-c", plan.cluster, _yaml_path("reserved.yaml")]
    command += ["--env-file", str(env_file), "--secret-file", str(secret_file), *_config_flags(plan)]
    if plan.reserved_accelerators is not None:
        command += ["--gpus", "{}:{}".format(*plan.reserved_accelerators)]
    if plan.public_queue:
        command += ["--ports", str(REDIS_PORT)]
    lines = [f"# files (0600) in {folder}: the run's config, each task's --env-file and --secret-file"]
    lines += _notes(plan) + ["# 1. the reserved node", shlex.join(command)]
    if place is None:
        return lines + [
            f"# 2. the spot workers: run this again once `sky status {plan.cluster}` shows the node UP (their queue "
            "is its private address, and they start in its region)"
        ]
    queue = f"rediss://{queue_host or f'{place.private_ip}:{REDIS_PORT}'}/0"
    indexes = range(1, plan.spot_workers + 1)
    tasks = [worker_task(hand, secrets, index, run_config, queue, place=place) for index in indexes]
    users = [urlsplit(task.envs["SPOTLIGHT_QUEUE"]).username or "" for task in tasks]
    needs = f"{PASSWORD_ENV} and {RUN_CA_ENV}"
    if plan.public_queue:  # mutual TLS: the node cuts a client without a certificate of the run's CA, even on loopback
        needs = f"{PASSWORD_ENV}, {RUN_CA_ENV} and {CLIENT_CERT_ENV}/{CLIENT_KEY_ENV} (a worker's secret file's)"
    lines.append(
        "# 2. grant each worker job's own ACL user on the node's Redis first, as the coordinator (with "
        f"{needs} set, through `ssh -L 6379:127.0.0.1:6379 {plan.cluster}`):"
    )
    lines.append(shlex.join(["python", "-m", "resources.queue.redis_acl", "--queue", NODE_QUEUE, "grant", *users]))
    lines.append(f"# 3. the spot workers (queue {queue}, each as its own user), one managed job each")
    for index, task in zip(indexes, tasks, strict=True):
        env_file, secret_file = _task_files(task, folder, f"worker-{index}")
        command = ["sky", "jobs", "launch", "-y", "-d", _yaml_path("spot_workers.yaml")]
        command += ["-n", worker_job_name(plan.cluster, index), "--env-file", str(env_file)]
        command += ["--secret-file", str(secret_file), *_config_flags(plan), *_worker_resources(plan, place)]
        lines.append(shlex.join(command))
    return lines


def _yaml_path(name: str) -> str:
    """sky/NAME relative to where the commands are printed (and so run)."""
    return os.path.relpath(SKY_DIR / name)


def _worker_resources(plan: LaunchPlan, place: NodePlace) -> list[str]:
    """--infra (a private queue's workers start in the node's cloud and region) and --gpus (one type asked for)."""
    flags = [] if plan.public_queue else ["--infra", place.infra]
    if len(plan.gpus) == 1:
        flags += ["--gpus", f"{plan.gpus[0]}:{plan.node_gpus}"]
    return flags


def _notes(plan: LaunchPlan) -> list[str]:
    notes = []
    if plan.env_cache:
        notes.append("# by hand, the nodes install their venv (the env-cache bucket mount is launch's alone)")
    if plan.model_source is not None:
        notes.append(f"# add to both YAMLs' file_mounts:  {plan.model}: {plan.model_source}")
    if len(plan.gpus) > 1:
        notes.append(f"# set the spot YAML's any_of to {', '.join(plan.gpus)} (several types: no CLI flag)")
    if plan.node_gpus > 1 and len(plan.gpus) != 1:
        notes.append(f"# give the spot YAML's any_of {plan.node_gpus} GPUs per option (an SP node)")
    return notes
