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
grants on the node's Redis (resources/queue/redis_acl.py) just before it submits that job, once Redis answers.

Prices (resources/cloud/pricing.py): each spot worker, and the reserved node plus the jobs controller VM, from
SkyPilot's catalog for what is launched (`reserved_gpus` overrides the YAML's accelerators). With `aws_identity`
a role, SkyPilot's `aws.remote_identity` gives the nodes an IAM role and no task carries the AWS keys. Tasks are
built in resources/cloud/tasks.py.

Example:
    plan = LaunchPlan(spot_workers=8, run=resolved.config, gpus=("A100",), max_usd=200)
    secrets = with_run_tls(launch_secrets(os.environ), run_tls(tls_folder(plan.cluster)))
    tasks = plan_tasks(plan, secrets, ship_run_config(plan, folder))   # what --dry-run prints (describe_task)
    queue_url = launch(plan, secrets)                    # check_clouds, sky.launch, wait for Redis, sky.jobs.launch
    teardown(plan.cluster)                               # sky.jobs.cancel + sky.down
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping
from urllib.parse import urlsplit

import sky
from resources.cloud.plan import RESERVED_CLUSTER, CloudError, LaunchPlan
from resources.cloud.pricing import catalog_price, reserved_price
from resources.cloud.tasks import (
    CHECKOUT,
    PLACEHOLDER_QUEUE,
    REDIS_PORT,
    SECRET_NAMES,
    STATE_DIR_ENV,
    WORKER_JOB_PREFIX,
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
from resources.urls import PASSWORD_ENV, RUN_CA_ENV, redis_address
from sky import exceptions as sky_exceptions

__all__ = [
    "CHECKOUT",
    "PLACEHOLDER_QUEUE",
    "RESERVED_CLUSTER",
    "SECRET_NAMES",
    "STATE_DIR_ENV",
    "CloudError",
    "LaunchPlan",
    "aws_identity",
    "check_clouds",
    "describe_task",
    "launch",
    "launch_secrets",
    "placed_run_config",
    "plan_tasks",
    "reserved_address",
    "reserved_node",
    "reserved_task",
    "run_config_folder",
    "ship_run_config",
    "teardown",
    "tls_folder",
    "use_run_ca",
    "wait_for_redis",
    "with_run_tls",
    "worker_jobs",
    "worker_task",
    "yaml_task",
]
REDIS_WAIT_S = 1200.0
"""How long `launch` waits for the reserved node's Redis to answer after `sky.launch` returns (its setup included)."""


@contextlib.contextmanager
def aws_identity(plan: LaunchPlan) -> Iterator[None]:
    """SkyPilot's config with `aws.remote_identity` set to the plan's instance role (an IAM instance profile, or
    SkyPilot's own role) while launching: every request carries it to the API server, so the reserved node, the jobs
    controller and each spot job's VM get the role instead of this machine's keys. The plan's default (keys) leaves
    SkyPilot's config as it is."""
    if plan.remote_identity is None:
        yield
        return
    from sky import skypilot_config

    config = skypilot_config.to_dict()
    config.set_nested(("aws", "remote_identity"), plan.remote_identity)
    with skypilot_config.replace_skypilot_config(config):
        yield


_API_FAILURES = (
    sky_exceptions.ApiServerConnectionError,
    sky_exceptions.ApiServerAuthenticationError,
    sky_exceptions.APIVersionMismatchError,
    sky_exceptions.ServerTemporarilyUnavailableError,
    sky_exceptions.NoCloudAccessError,
    sky_exceptions.CloudUserIdentityError,
)
"""What SkyPilot raises when its API server cannot answer (down, needs a login, another version) or no cloud
account can be read: nothing can be launched or found then."""


def check_clouds(enabled: Callable[[], list[str]] | None = None) -> list[str]:
    """The clouds SkyPilot may launch on; CloudError naming `sky check` when there is none (or it cannot say)."""
    try:
        clouds = list((enabled or _enabled_clouds)())
    except _API_FAILURES as err:
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
    """Start the reserved node, wait until its Redis answers (TLS, the run's CA, the password), then submit the spot
    workers that are not already running (a second launch of a run resumes it); returns the coordinator's queue URL
    (no password). `secrets`: launch_secrets with the run's TLS material (with_run_tls).
    `before_workers(queue_url)` may raise to stop before any worker is submitted (the spend cap)."""
    clouds = check_clouds()
    echo(f"enabled clouds: {', '.join(clouds)}; starting {plan.cluster}")
    usd_per_hour = reserved_price(reserved_node(plan), clouds, echo)
    run_config = ship_run_config(plan, run_config_folder(plan.cluster), usd_per_hour)
    reserved = reserved_task(plan, secrets, run_config)
    with aws_identity(plan):
        sky.stream_and_get(sky.launch(reserved, cluster_name=plan.cluster))
    address = reserved_address(plan.cluster)
    queue_url = f"rediss://{address}/0"
    wait_for_redis(queue_url, secrets, REDIS_WAIT_S if redis_wait_s is None else redis_wait_s, echo)
    if before_workers is not None:
        before_workers(queue_url)
    workers = catalog_price(plan, clouds, echo)
    _submit_workers(plan, secrets, run_config, queue_url, workers, echo)
    return queue_url


def _submit_workers(
    plan: LaunchPlan,
    secrets: Mapping[str, str],
    run_config: Path,
    queue_url: str,
    usd_per_hour: float | None,
    echo: Callable,
) -> None:
    """One managed job per spot worker, skipping those already unfinished (a relaunch resumes the run); each job
    submitted gets its own ACL user, granted on the node's Redis (`queue_url`: the coordinator's) first."""
    running = {job["name"]: job for job in worker_jobs(echo)}
    for index in range(1, plan.spot_workers + 1):
        task = worker_task(plan, secrets, index, run_config, queue_url, usd_per_hour)
        if task.name not in running:
            grant_worker_at(queue_url, secrets, urlsplit(task.envs["SPOTLIGHT_QUEUE"]).username or "")
        if task.name in running:
            echo(
                f"{task.name} is already running (managed job {running[task.name]['job_id']}, "
                f"{running[task.name]['status']}): not submitted again"
            )
            continue
        with aws_identity(plan):
            job_ids, _ = sky.get(sky.jobs.launch(task, name=task.name))
        echo(f"submitted {task.name} (managed job {', '.join(map(str, job_ids or []))})")


def wait_for_redis(
    queue_url: str,
    secrets: Mapping[str, str],
    timeout_s: float,
    echo: Callable[[str], None] = print,
    poll_s: float = 5.0,
) -> None:
    """Poll the reserved node's Redis until it answers a PING with the password (over TLS, trusting the run's CA
    alone); CloudError (nothing more submitted) when it refuses the password or stays silent for `timeout_s` (its
    setup or run block failed)."""
    import time

    address = redis_address(queue_url, {k: secrets[k] for k in (PASSWORD_ENV, RUN_CA_ENV) if secrets.get(k)})
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
                    f"not sign ({err}); no spot workers submitted. Is {RESERVED_CLUSTER} another run's "
                    "node? Its TLS files are kept under $SPOTLIGHT_STATE_DIR (~/.spotlight)"
                ) from None
            last = err
        if time.monotonic() + poll_s > deadline:
            raise CloudError(
                f"the reserved node's Redis at {address.host}:{address.port} did not answer within "
                f"{timeout_s:g} s ({last}); no spot workers submitted. Its setup or run block may have "
                f"failed: see `sky logs {RESERVED_CLUSTER}`, then `spotlight launch` again (it resumes)"
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


def use_run_ca(cluster: str, env: Any = os.environ) -> bool:
    """Trust the run's CA in this process (SPOTLIGHT_REDIS_RUN_CA in `env`) when its TLS files are on this machine
    and nothing else is set: `spotlight status` and a relaunch then reach the node's Redis. False when absent."""
    ca = tls_folder(cluster, env) / FILES[0]
    if env.get(RUN_CA_ENV) or not ca.is_file():
        return bool(env.get(RUN_CA_ENV))
    import base64

    env[RUN_CA_ENV] = base64.b64encode(ca.read_bytes()).decode("ascii")
    return True


def reserved_address(cluster: str = RESERVED_CLUSTER) -> str:
    """host:port of the reserved node's Redis; CloudError when the cluster is not up."""
    try:
        endpoints = sky.get(sky.endpoints(cluster, REDIS_PORT))
    except (sky_exceptions.ClusterNotUpError, sky_exceptions.ClusterDoesNotExist, *_API_FAILURES) as err:
        raise CloudError(f"cannot find the reserved node {cluster!r} ({err}); is it up? (`sky status`)") from None
    if not endpoints:
        raise CloudError(
            f"the reserved node {cluster!r} exposes no port {REDIS_PORT}; relaunch it with `spotlight launch`"
        )
    return str(next(iter(endpoints.values())))


def worker_jobs(echo: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """This project's unfinished managed spot jobs (name, id, plain status word), from `sky.jobs.queue_v2`. A
    stopped jobs controller (it stops itself once idle) runs no job: [] then, and `echo` says so."""
    try:
        records, *_ = sky.get(sky.jobs.queue_v2(refresh=False, skip_finished=True, name_match=WORKER_JOB_PREFIX))
    except sky_exceptions.ClusterNotUpError:
        if echo is not None:
            echo("the managed-jobs controller is stopped: no spot worker job is running")
        return []
    return [
        {"name": r.job_name, "job_id": r.job_id, "status": _status_word(r.status)}
        for r in records
        if str(r.job_name or "").startswith(WORKER_JOB_PREFIX)
    ]


def _status_word(status: Any) -> str | None:
    """ManagedJobStatus.RECOVERING -> "RECOVERING" (the enum's value; str() would print the class name)."""
    return None if status is None else str(getattr(status, "value", status))


def teardown(cluster: str = RESERVED_CLUSTER, echo: Callable[[str], None] = print) -> None:
    """Cancel every spot worker job, then take the reserved node down (billing stops), whatever state the jobs
    controller is in; a node already gone is reported, not an error."""
    ids = [j["job_id"] for j in worker_jobs(echo) if j["job_id"] is not None]
    if ids:
        sky.get(sky.jobs.cancel(job_ids=ids))
        echo(f"cancelled {len(ids)} spot worker job(s)")
    try:
        sky.get(sky.down(cluster))
    except sky_exceptions.ClusterDoesNotExist:
        echo(f"{cluster} does not exist (already down)")
        return
    echo(f"{cluster} is down")
