"""The cloud path through SkyPilot's Python API: the reserved node and N spot workers as `sky.Task`s, submitted,
listed and torn down (`spotlight launch / status / down`, pipelines/launch_cli.py).

The tasks are sky/reserved.yaml and sky/spot_workers.yaml, parsed by SkyPilot and then
adjusted (envs, secrets, accelerators): the YAMLs stay the documented way to launch by
hand, and `launch` submits exactly what `--dry-run` prints. The reserved node goes up with
`sky.launch`; each spot worker is its own managed job (`sky.jobs.launch`), so a preemption
takes down one worker and SkyPilot's job recovery brings it back. Nothing is submitted
before `check_clouds` has found an enabled cloud.

Every node runs the same file: the run's resolved config tree (`plan.run`), placed on the cloud
(`placed_run_config`: the node's Redis, run folder and price) and written by `ship_run_config`, is a
SkyPilot file mount of both tasks; the reserved node runs `spotlight run --config` on it, each spot
worker `python -m workers.rollout --config` (its knobs, the model, the device). With a model (a
diffusers pipeline folder, the tree's model.model) every spot worker checks the folder at start, and
the node's own workers are dropped (they would share the trainer's GPU). The weights must sit at that
absolute path on every node: `model_source` (a bucket URL) adds a SkyPilot file mount that copies them
there.

With `sp_degree` (2..8, or "auto"), each spot job is an SP node instead of one rollout worker:
a node of `gpus_per_node` GPUs (of each type asked for) whose run line starts the elastic SP
node agent (`SP_DEGREE`, sky/spot_workers.yaml), priced for the ledger at its GPUs together.

The reserved node's Redis is TLS-only, signed by a CA made for the run (resources/queue/redis_tls.py): the node
gets the server's key, each worker job only the CA certificate and the password of its own ACL user, which `launch`
grants on the node's Redis (resources/queue/redis_acl.py) just before it submits that job (and, for a public queue,
the workers' client certificate, which this machine signs with the run's CA key). Its port is open to no one by
default: the workers reach it on the node's private address and this machine through an SSH tunnel
(resources/cloud/network.py), which also carries the grants; `public_queue` opens it, with mutual TLS. `launch`
submits workers once that Redis answers. Worker jobs carry the run's cluster name (resources/cloud/jobs.py), so runs
launched side by side never touch each other's jobs. The venv cache is signed by the reserved node with the run's
key (resources/cloud/env_pin.py).

Prices (resources/cloud/pricing.py): each spot worker, and the reserved node plus the jobs controller VM, from
SkyPilot's catalog for what is launched (`reserved_gpus` overrides the YAML's accelerators). With `aws_identity`
a role, SkyPilot's `aws.remote_identity` gives the nodes an IAM role and no task carries the AWS keys (the CLI's
default where SkyPilot's config names one; keys only when asked for). Tasks are
built in resources/cloud/tasks.py.

Example:
    plan = LaunchPlan(spot_workers=8, run=resolved.config, gpus=("A100",), max_usd=200)
    secrets = with_run_tls(launch_secrets(os.environ), run_tls(tls_folder(plan.cluster)))   # + with_env_signing
    tasks = plan_tasks(plan, secrets, ship_run_config(plan, folder))   # what --dry-run prints (describe_task)
    queue_url = launch(plan, secrets)                    # check_clouds, sky.launch, wait for Redis, sky.jobs.launch
    teardown(plan.cluster)                               # sky.jobs.cancel + sky.down
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

import sky
from resources.cloud.env_pin import env_signing, with_env_signing
from resources.cloud.jobs import API_FAILURES, is_run_worker, teardown, worker_job_name, worker_jobs
from resources.cloud.network import (
    NodePlace,
    launcher_route,
    node_place,
    skypilot_overrides,
    worker_queue_host,
)
from resources.cloud.plan import RESERVED_CLUSTER, CloudError, LaunchPlan
from resources.cloud.pricing import catalog_price, reserved_price
from resources.cloud.tasks import (
    CHECKOUT,
    PLACEHOLDER_QUEUE,
    REDIS_PORT,
    SECRET_NAMES,
    STATE_DIR_ENV,
    describe_task,
    launch_secrets,
    placed_run_config,
    plan_tasks,
    reserved_node,
    reserved_task,
    run_config_folder,
    ship_run_config,
    tls_folder,
    with_run_tls,
    worker_task,
    yaml_task,
)
from resources.queue.redis_acl import grant_worker_at
from resources.queue.redis_tls import FILES
from resources.urls import CLIENT_CERT_ENV, CLIENT_KEY_ENV, PASSWORD_ENV, RUN_CA_ENV, redis_address

__all__ = [
    "CHECKOUT",
    "PLACEHOLDER_QUEUE",
    "REDIS_PORT",
    "RESERVED_CLUSTER",
    "SECRET_NAMES",
    "STATE_DIR_ENV",
    "CloudError",
    "LaunchPlan",
    "NodePlace",
    "check_clouds",
    "describe_task",
    "env_signing",
    "is_run_worker",
    "launch",
    "launch_secrets",
    "launcher_route",
    "node_place",
    "placed_run_config",
    "plan_tasks",
    "reserved_node",
    "reserved_task",
    "run_config_folder",
    "ship_run_config",
    "skypilot_overrides",
    "teardown",
    "tls_folder",
    "use_run_ca",
    "wait_for_redis",
    "with_env_signing",
    "with_run_tls",
    "worker_job_name",
    "worker_jobs",
    "worker_task",
    "yaml_task",
]
REDIS_WAIT_S = 1200.0
"""How long `launch` waits for the reserved node's Redis to answer after `sky.launch` returns (its setup included)."""


def check_clouds(enabled: Callable[[], list[str]] | None = None) -> list[str]:
    """The clouds SkyPilot may launch on; CloudError naming `sky check` when there is none (or it cannot say)."""
    try:
        clouds = list((enabled or _enabled_clouds)())
    except API_FAILURES as err:
        raise CloudError(
            f"SkyPilot could not list its enabled clouds ({type(err).__name__}: {err}); run `sky check` "
            "to set up cloud credentials; nothing was submitted"
        ) from None
    if not clouds:
        raise CloudError(
            "no cloud is enabled in SkyPilot (no credentials found); run `sky check` to see what each "
            "cloud needs; nothing was submitted"
        )
    return clouds


def _enabled_clouds() -> list[str]:
    from sky.client import sdk

    return [str(c) for c in sky.get(sdk.enabled_clouds())]


def launch(
    plan: LaunchPlan,
    secrets: Mapping[str, str],
    *,
    before_workers: Callable[[str], None] | None = None,
    echo: Callable[[str], None] = print,
    redis_wait_s: float | None = None,
) -> str:
    """Start the reserved node, wait until its Redis answers (TLS, the run's CA, the password), then submit the run's
    spot workers that are not already running (a second launch of a run resumes it); returns the workers' queue URL
    (no password). `secrets`: launch_secrets with the run's TLS material (with_run_tls) and env-cache keys
    (with_env_signing). `before_workers(queue_url)` may raise to stop before any worker is submitted (the spend cap);
    it gets the URL this machine reaches the node's Redis at, valid while it runs."""
    clouds = check_clouds()
    echo(f"enabled clouds: {', '.join(clouds)}; starting {plan.cluster}")
    usd_per_hour = reserved_price(reserved_node(plan), clouds, echo)
    run_config = ship_run_config(plan, run_config_folder(plan.cluster), usd_per_hour)
    reserved = reserved_task(plan, secrets, run_config)
    with skypilot_overrides(plan):
        sky.stream_and_get(sky.launch(reserved, cluster_name=plan.cluster))
    place = node_place(plan.cluster)
    workers = catalog_price(plan, clouds if plan.public_queue else [str(place.cloud)], echo)  # where they start
    queue_url = f"rediss://{worker_queue_host(plan, place)}/0"  # each job adds its own ACL user
    with launcher_route(plan.cluster, plan.public_queue) as address:  # held while the workers are submitted
        wait_s = REDIS_WAIT_S if redis_wait_s is None else redis_wait_s
        wait_for_redis(f"rediss://{address}/0", secrets, wait_s, echo, cluster=plan.cluster)
        if before_workers is not None:
            before_workers(f"rediss://{address}/0")
        _submit_workers(plan, secrets, run_config, queue_url, workers, place, echo, admin_url=f"rediss://{address}/0")
    return queue_url


def _submit_workers(
    plan: LaunchPlan,
    secrets: Mapping[str, str],
    run_config: Path,
    queue_url: str,
    usd_per_hour: float | None,
    place: NodePlace,
    echo: Callable,
    admin_url: str,
) -> None:
    """One managed job per spot worker, skipping this run's jobs already unfinished (a relaunch resumes the run); each
    job submitted gets its own ACL user, granted first on the node's Redis as the coordinator (`admin_url`: this
    machine's route to it, the SSH tunnel of a private queue), and the user of the slot's earlier job, recorded in
    the run's state folder (`worker_users_granted`), is revoked: a job that ended keeps no credential."""
    running = {job["name"]: job for job in worker_jobs(plan.cluster, echo)}
    users = worker_users_granted(plan.cluster)
    for index in range(1, plan.spot_workers + 1):
        task = worker_task(plan, secrets, index, run_config, queue_url, usd_per_hour, place)
        if task.name not in running:  # the slot's earlier job (failed, cancelled) loses its user
            user = urlsplit(task.envs["SPOTLIGHT_QUEUE"]).username or ""
            _grant(admin_url, secrets, user, task.name, replaces=users.get(task.name))
            users[task.name] = user
            save_worker_users(plan.cluster, users)
        if task.name in running:
            echo(
                f"{task.name} is already running (managed job {running[task.name]['job_id']}, "
                f"{running[task.name]['status']}): not submitted again"
            )
            continue
        with skypilot_overrides(plan):
            job_ids, _ = sky.get(sky.jobs.launch(task, name=task.name))
        echo(f"submitted {task.name} (managed job {', '.join(map(str, job_ids or []))})")


def _grant(admin_url: str, secrets: Mapping[str, str], user: str, job: str, replaces: str | None = None) -> None:
    """grant_worker_at (revoking `replaces` first), or CloudError (the jobs submitted so far stay; a relaunch
    resumes) when Redis cannot do it."""
    import redis

    try:
        grant_worker_at(admin_url, secrets, user, replaces=replaces)
    except redis.exceptions.RedisError as err:
        raise CloudError(
            f"could not grant {job}'s Redis user on the reserved node ({type(err).__name__}: {err}); {job} and the "
            "workers after it were not submitted: `spotlight launch` again resumes the run"
        ) from None


def wait_for_redis(
    queue_url: str,
    secrets: Mapping[str, str],
    timeout_s: float,
    echo: Callable[[str], None] = print,
    poll_s: float = 5.0,
    cluster: str = RESERVED_CLUSTER,
) -> None:
    """Poll the reserved node's Redis until it answers a PING with the password (over TLS, trusting the run's CA
    alone, showing the run's client certificate when `secrets` hold one: a public queue's mutual TLS); CloudError
    (nothing more submitted) when it refuses the password or stays silent for `timeout_s` (its setup or run block
    failed)."""
    import time

    names = (PASSWORD_ENV, RUN_CA_ENV, CLIENT_CERT_ENV, CLIENT_KEY_ENV)  # a public queue's node asks for the cert
    address = redis_address(queue_url, {k: secrets[k] for k in names if secrets.get(k)})
    deadline, last = time.monotonic() + timeout_s, None
    while True:
        try:
            _ping(address, connect_timeout_s=min(5.0, max(timeout_s, 0.1)))
            return
        except PermissionError as err:
            raise CloudError(
                f"the reserved node's Redis at {address.host}:{address.port} refused the password "
                f"({err}); no spot workers submitted"
            ) from None
        except OSError as err:
            if "CERTIFICATE_VERIFY_FAILED" in str(err):
                raise CloudError(
                    f"the Redis at {address.host}:{address.port} presents a certificate the run's CA did "
                    f"not sign ({err}); no spot workers submitted. Is {cluster} another run's "
                    "node? Its TLS files are kept under $SPOTLIGHT_STATE_DIR (~/.spotlight)"
                ) from None
            last = err
        if time.monotonic() + poll_s > deadline:
            raise CloudError(
                f"the reserved node's Redis at {address.host}:{address.port} did not answer within "
                f"{timeout_s:g} s ({last}); no spot workers submitted. Its setup or run block may have "
                f"failed: see `sky logs {cluster}`, then `spotlight launch` again (it resumes)"
            )
        echo(f"waiting for Redis at {address.host}:{address.port} ...")
        time.sleep(poll_s)


def _ping(address: Any, connect_timeout_s: float) -> None:
    """One PING through redis-py: PermissionError for a refused password, OSError while the server is not there."""
    import redis

    from resources.queue.redis_streams import redis_client  # lazy: pulls redis

    client = redis_client(address, socket_connect_timeout=connect_timeout_s, socket_timeout=connect_timeout_s)
    try:
        with client:
            client.ping()
    except redis.exceptions.AuthenticationError as err:
        raise PermissionError(str(err)) from None
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as err:
        raise OSError(str(err)) from None


def use_run_ca(cluster: str, env: Any = os.environ, client_cert: bool = False) -> bool:
    """Trust the run's CA in this process (SPOTLIGHT_REDIS_RUN_CA in `env`) when its TLS files are on this machine
    and nothing else is set: `spotlight status` and a relaunch then reach the node's Redis. With `client_cert` (a
    public queue: mutual TLS) also show a client certificate signed now by the run's CA key, when this machine kept
    it and `env` names none. False when absent."""
    folder = tls_folder(cluster, env)
    if client_cert and not env.get(CLIENT_CERT_ENV) and all((folder / name).is_file() for name in FILES):
        from resources.queue.redis_tls import run_tls

        tls = run_tls(folder)
        if tls.ca_key_pem is not None:
            env.update({k: v for k, v in with_run_tls({}, tls).items() if k in (CLIENT_CERT_ENV, CLIENT_KEY_ENV)})
    ca = folder / FILES[0]
    if env.get(RUN_CA_ENV) or not ca.is_file():
        return bool(env.get(RUN_CA_ENV))
    import base64

    env[RUN_CA_ENV] = base64.b64encode(ca.read_bytes()).decode("ascii")
    return True


WORKER_USERS_FILE = "worker-users.json"
"""In the run's state folder (0600): each worker job name -> the ACL user its last submission was granted."""


def worker_users_granted(cluster: str) -> dict[str, str]:
    """The users `launch` granted `cluster`'s worker jobs ({} before the first); a relaunch revokes a slot's old one."""
    import json

    path = run_config_folder(cluster) / WORKER_USERS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def save_worker_users(cluster: str, users: Mapping[str, str]) -> None:
    """Record the users granted to `cluster`'s worker jobs (names only: the passwords derive from the node's)."""
    import json

    from resources.cloud.by_hand import write_private

    folder = run_config_folder(cluster)
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_private(folder / WORKER_USERS_FILE, json.dumps(dict(users), indent=1, sort_keys=True))
