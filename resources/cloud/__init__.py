"""The cloud path through SkyPilot's Python API: the reserved node and N spot workers as `sky.Task`s, submitted,
listed and torn down (`spotlight launch / status / down`, pipelines/launch_cli.py).

The tasks are sky/reserved.yaml and sky/spot_workers.yaml, parsed by SkyPilot and then
adjusted (envs, secrets, accelerators): the YAMLs stay the documented way to launch by
hand, and `launch` submits exactly what `--dry-run` prints. The reserved node goes up with
`sky.launch`; each spot worker is its own managed job (`sky.jobs.launch`), so a preemption
takes down one worker and SkyPilot's job recovery brings it back. Nothing is submitted
before `check_clouds` has found an enabled cloud.

With `model` (a diffusers pipeline folder), both tasks get `MODEL`: the reserved node's run
line passes `--model`, every spot worker checks the folder at start, and the node's own
CPU workers are dropped (`LOCAL_WORKERS=0`; they cannot sample a real model). The weights
must sit at that absolute path on every node: `model_source` (a bucket URL) adds a SkyPilot
file mount that copies them there.

With `sp_degree` (2..8, or "auto"), each spot job is an SP node instead of one rollout worker:
a node of `gpus_per_node` GPUs (of each type asked for) whose run line starts the elastic SP
node agent (`SP_DEGREE`, sky/spot_workers.yaml), priced for the ledger at its GPUs together.

The reserved node's Redis is TLS-only, signed by a CA made for the run, with an ACL user for
the workers (resources/queue/redis_tls.py): the node gets the server's key, each worker only
the CA certificate and its own password. `launch` submits workers once that Redis answers.

Example:
    plan = LaunchPlan(workers=8, store="s3://bucket/spotlight", gpus=("A100",), max_usd=200)
    secrets = with_run_tls(launch_secrets(os.environ), run_tls(tls_folder(plan.cluster)))
    tasks = plan_tasks(plan, secrets)                    # what --dry-run prints (describe_task)
    queue_url = launch(plan, secrets)                    # check_clouds, sky.launch, wait for Redis, sky.jobs.launch
    teardown(plan.cluster)                               # sky.jobs.cancel + sky.down
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

import sky
from resources.cloud.plan import RESERVED_CLUSTER, LaunchPlan
from resources.prices import PriceTable
from resources.queue.redis_tls import CERT_ENV, KEY_ENV, WORKER_USER, RunTls, worker_password
from resources.urls import PASSWORD_ENV, PASSWORD_FILE_ENV, RUN_CA_ENV, redis_password
from sky import exceptions as sky_exceptions

WORKER_JOB_PREFIX = "spotlight-rollout"
"""Spot worker i is the managed job `spotlight-rollout-i`; `status` and `down` find them by this prefix."""
REDIS_PORT = 6379
SECRET_NAMES = (PASSWORD_ENV, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
CHECKOUT = Path(__file__).resolve().parents[2]
"""The repository: the YAMLs' folder and the workdir SkyPilot syncs to every node."""
SKY_DIR = CHECKOUT / "sky"
PLACEHOLDER_QUEUE = f"rediss://{WORKER_USER}@RESERVED_NODE_IP:{REDIS_PORT}/0"
"""The spot workers' queue before the reserved node has an address (what --dry-run shows)."""
STATE_DIR_ENV = "SPOTLIGHT_STATE_DIR"
"""Folder of what `spotlight launch` keeps on this machine between launches (each run's TLS files)."""
REDIS_WAIT_S = 1200.0
"""How long `launch` waits for the reserved node's Redis to answer after `sky.launch` returns (its setup included)."""


class CloudError(RuntimeError):
    """The cloud path cannot go on; the message says what to fix (and nothing was submitted unless it says so)."""


def launch_secrets(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The secrets every node needs, from this machine's environment; CloudError naming the missing ones."""
    try:
        password = redis_password(env)
    except ValueError as err:
        raise CloudError(str(err)) from None
    missing = (
        []
        if password
        else [f"{PASSWORD_ENV} (e.g. export {PASSWORD_ENV}=$(openssl rand -hex 24)) or {PASSWORD_FILE_ENV}"]
    )
    missing += [name for name in SECRET_NAMES[1:] if not env.get(name)]
    if missing:
        raise CloudError(
            f"set {' and '.join(missing)} before launching: the nodes get them as SkyPilot secrets "
            "(never on a command line); the AWS keys reach the S3 store"
        )
    return {PASSWORD_ENV: password, **{name: env[name] for name in SECRET_NAMES[1:]}}


def yaml_task(name: str, secrets: Mapping[str, str]) -> sky.Task:
    """sky/`name` parsed by SkyPilot with the secrets it declares filled in (`secrets_overrides`, as `--secret NAME`
    does). A YAML's `NAME: null` secret is a managed-secret reference: filled in after parsing (`update_secrets`) the
    reference stays, and SkyPilot's launch refuses it ("No value available for secret(s)"). A declared secret
    missing from `secrets` stays a reference (a dry run without credentials)."""
    config = yaml.safe_load((SKY_DIR / name).read_text())
    declared = list(config.get("secrets") or {})
    given = [(k, secrets[k]) for k in declared if secrets.get(k)]
    return sky.Task.from_yaml_config(config, secrets_overrides=given or None)


def tls_folder(cluster: str, env: Mapping[str, str] = os.environ) -> Path:
    """Where this machine keeps a run's TLS files (0700): $SPOTLIGHT_STATE_DIR (default ~/.spotlight)/CLUSTER/redis-tls."""
    return Path(env.get(STATE_DIR_ENV) or "~/.spotlight").expanduser() / cluster / "redis-tls"


def with_run_tls(secrets: Mapping[str, str], tls: RunTls) -> dict[str, str]:
    """The launch secrets plus the run's TLS material: the CA for everyone, the server's certificate and key for the
    reserved node only (each task takes only the secrets its YAML declares)."""
    return {**secrets, RUN_CA_ENV: tls.b64("ca_pem"), CERT_ENV: tls.b64("cert_pem"), KEY_ENV: tls.b64("key_pem")}


def reserved_task(plan: LaunchPlan, secrets: Mapping[str, str]) -> sky.Task:
    """sky/reserved.yaml with the plan's store, preset, iterations and cap, and the run's TLS material."""
    task = yaml_task("reserved.yaml", secrets)
    envs = {
        "SPOTLIGHT_STORE": plan.store,
        "MAX_USD": f"{plan.max_usd:g}",
        "REDIS_PORT": str(REDIS_PORT),
        **({RUN_CA_ENV: secrets[RUN_CA_ENV]} if secrets.get(RUN_CA_ENV) else {}),
    }
    envs.update({k: str(v) for k, v in (("PRESET", plan.preset), ("ITERATIONS", plan.iterations)) if v is not None})
    if plan.model is not None:
        envs.update(MODEL=plan.model, LOCAL_WORKERS="0")  # the node's CPU cannot sample a diffusers pipeline
    envs.update({k: v for k, v in (("REWARD", plan.reward), ("PROMPTS", plan.prompts)) if v is not None})
    return _finish(task, envs, plan)


def worker_task(
    plan: LaunchPlan,
    secrets: Mapping[str, str],
    index: int,
    queue_url: str = PLACEHOLDER_QUEUE,
    usd_per_hour: float | None = None,
) -> sky.Task:
    """sky/spot_workers.yaml as worker `index`'s managed job: the reserved node's queue (as the workers' ACL user,
    with their own password), the run's CA, the plan's GPUs."""
    if secrets.get(PASSWORD_ENV):
        secrets = {**secrets, PASSWORD_ENV: worker_password(secrets[PASSWORD_ENV])}
    task = yaml_task("spot_workers.yaml", secrets)
    task.name = f"{WORKER_JOB_PREFIX}-{index}"
    count = plan.node_gpus
    names = plan.gpus or tuple(sorted({next(iter(r.accelerators)) for r in task.resources}))
    if plan.gpus or count > 1:
        template = next(iter(task.resources))  # keep the YAML's use_spot and job_recovery
        task.set_resources({template.copy(accelerators={gpu: count}) for gpu in names})
    envs = {
        "SPOTLIGHT_QUEUE": queue_url,
        "SPOTLIGHT_STORE": plan.store,
        **({RUN_CA_ENV: secrets[RUN_CA_ENV]} if secrets.get(RUN_CA_ENV) else {}),
        # The node's spot price for the ledger and the cap, whatever types any_of allows (never the YAML's flat one).
        "USD_PER_HOUR": repr(usd_per_hour if usd_per_hour is not None else _node_usd_per_hour(names, count)),
    }
    if plan.model is not None:
        envs["MODEL"] = plan.model
    if plan.sp_degree not in (None, 1):
        envs["SP_DEGREE"] = str(plan.sp_degree)
    return _finish(task, envs, plan)


def _node_usd_per_hour(gpus: tuple[str, ...], count: int) -> float:
    """A node of `count` GPUs of one of `gpus`, at the spot price of the dearest: with several types the ledger cannot
    know which one SkyPilot found, and an SP node's price must not fall back to the YAML's one-GPU default (the spend
    cap reads it), so it errs high."""
    table = PriceTable()
    return round(max(table.usd_per_hour(gpu, spot=True)[0] for gpu in gpus) * count, 6)


def _finish(task: sky.Task, envs: Mapping[str, str], plan: LaunchPlan) -> sky.Task:
    task.update_envs(dict(envs))
    if plan.model_source is not None:  # copied from the bucket when the node starts (and again on recovery)
        task.update_file_mounts({plan.model: plan.model_source})
    task.workdir = str(CHECKOUT)  # the YAMLs' `workdir: .` means the checkout, wherever launch runs from
    return task


def plan_tasks(
    plan: LaunchPlan, secrets: Mapping[str, str], queue_url: str = PLACEHOLDER_QUEUE, usd_per_hour: float | None = None
) -> list[sky.Task]:
    """The reserved node's task, then one task per spot worker: everything `launch` submits."""
    return [reserved_task(plan, secrets)] + [
        worker_task(plan, secrets, i, queue_url, usd_per_hour) for i in range(1, plan.workers + 1)
    ]


def worker_gpus(plan: LaunchPlan) -> tuple[str, ...]:
    """The accelerator types a spot job may get: --gpu's, else sky/spot_workers.yaml's any_of."""
    return plan.gpus or tuple(
        sorted({next(iter(r.accelerators)) for r in yaml_task("spot_workers.yaml", {}).resources})
    )


def catalog_price(plan: LaunchPlan, clouds: list[str], echo: Callable[[str], None] = print) -> float | None:
    """A spot node's $/hour from SkyPilot's catalog on the enabled clouds (resources.prices), or None (the price
    table then applies, as in --dry-run) when the catalog cannot be read; says which."""
    from resources.prices import catalog_node_usd_per_hour

    found = catalog_node_usd_per_hour(worker_gpus(plan), plan.node_gpus, spot=True, clouds=[c.lower() for c in clouds])
    if found is None:
        echo("spot workers priced from the price table (SkyPilot's catalog could not be read or lists none)")
        return None
    echo(f"spot workers priced at ${found[0]:.4f}/h: {found[1]}")
    return found[0]


def describe_task(task: sky.Task) -> dict[str, Any]:
    """A task as plain data for --dry-run: resources, envs, and secret names only (values shown as ***)."""
    resources = sorted((_describe_resources(r) for r in task.resources), key=lambda r: str(r["accelerators"]))
    return {
        "name": task.name,
        "any_of": len(resources) > 1,
        "resources": resources,
        "envs": dict(task.envs),
        "file_mounts": {k: str(v) for k, v in (task.file_mounts or {}).items()},
        "secrets": {
            k: "***" if task.secrets.get(k) is not None and task.secrets[k].get_secret_value() else None
            for k in sorted(set(task.secrets) | set(SECRET_NAMES))
        },
        "workdir": task.workdir,
        "run": task.run,
    }


def _describe_resources(r: Any) -> dict[str, Any]:
    return {
        "accelerators": dict(r.accelerators or {}),
        "use_spot": bool(r.use_spot),
        "job_recovery": r.job_recovery,
        "ports": list(r.ports or []),
        "cloud": None if r.cloud is None else str(r.cloud),
    }


def check_clouds(enabled: Callable[[], list[str]] | None = None) -> list[str]:
    """The clouds SkyPilot may launch on; CloudError naming `sky check` when there is none (or it cannot say)."""
    try:
        clouds = list((enabled or _enabled_clouds)())
    except Exception as err:  # noqa: BLE001 (any failure of SkyPilot's API server means: nothing can be launched)
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
    sky.stream_and_get(sky.launch(reserved_task(plan, secrets), cluster_name=plan.cluster))
    address = reserved_address(plan.cluster)
    queue_url = f"rediss://{address}/0"
    wait_for_redis(queue_url, secrets, REDIS_WAIT_S if redis_wait_s is None else redis_wait_s, echo)
    if before_workers is not None:
        before_workers(queue_url)
    running = {job["name"]: job for job in worker_jobs(echo)}
    usd_per_hour = catalog_price(plan, clouds, echo)
    for index in range(1, plan.workers + 1):
        task = worker_task(plan, secrets, index, f"rediss://{WORKER_USER}@{address}/0", usd_per_hour)
        if task.name in running:
            echo(
                f"{task.name} is already running (managed job {running[task.name]['job_id']}, "
                f"{running[task.name]['status']}): not submitted again"
            )
            continue
        job_ids, _ = sky.get(sky.jobs.launch(task, name=task.name))
        echo(f"submitted {task.name} (managed job {', '.join(map(str, job_ids or []))})")
    return queue_url


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

    from resources.urls import redis_address

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

    from resources.queue.redis_streams import redis_client

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
    from resources.queue.redis_tls import FILES

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
    except Exception as err:  # noqa: BLE001 (SkyPilot raises several types for a missing cluster)
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
