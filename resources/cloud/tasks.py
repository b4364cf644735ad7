"""The SkyPilot tasks of a launch: sky/reserved.yaml and sky/spot_workers.yaml parsed by SkyPilot and adjusted (envs,
secrets, accelerators, mounts), exactly what `spotlight launch` submits and `--dry-run` prints.

Every task mounts the run's config file (`ship_run_config`): the run's resolved tree placed on the cloud
(`placed_run_config`: the node's queue, run folder and price), which the reserved node runs with
`spotlight run --config` and every spot worker reads with `python -m workers.rollout --config` (or workers.sp). No run
setting travels as an environment variable.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any, Mapping

import yaml
from pydantic import ValidationError

import sky
from resources.cloud.env_pin import ENV_VERIFY_KEY_ENV
from resources.cloud.jobs import worker_job_name
from resources.cloud.network import REDIS_PORT, NodePlace
from resources.cloud.plan import CloudError, LaunchPlan
from resources.prices import PriceTable
from resources.queue.redis_acl import new_nonce, with_user, worker_password, worker_user
from resources.queue.redis_tls import CERT_ENV, KEY_ENV, RunTls
from resources.reward_http import REWARD_TOKEN_ENV  # a secret of every node; the YAMLs declare it empty
from resources.settings.config import RunConfig
from resources.settings.resolve import derive, to_yaml
from resources.urls import CLIENT_CERT_ENV, CLIENT_KEY_ENV, PASSWORD_ENV, PASSWORD_FILE_ENV, RUN_CA_ENV, redis_password

AWS_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
MIN_PASSWORD_CHARS = 16
"""The shortest Redis password a launch accepts (`openssl rand -hex 24` gives 48)."""
SECRET_NAMES = (PASSWORD_ENV, *AWS_KEYS, REWARD_TOKEN_ENV)
MTLS_ENV = "REDIS_MUTUAL_TLS"
"""On the reserved node: "yes" makes its Redis require a client certificate of the run's CA (`tls-auth-clients
yes`, resources/queue/redis_tls.py --mutual-tls); set by a launch with a public queue (`LaunchPlan.public_queue`)."""
CLIENT_CERT_NAME = "spotlight-workers"
"""The common name of the client certificate a public queue's workers show (signed by the run's CA at launch)."""
CHECKOUT = Path(__file__).resolve().parents[2]
"""The repository: the YAMLs' folder and the workdir SkyPilot syncs to every node."""
SKY_DIR = CHECKOUT / "sky"
CLOUD_PLACED = (
    "deployment.deployment",
    "deployment.queue",
    "deployment.run_dir",
    "deployment.ledger",
    "deployment.rollouts",
    "deployment.reserved_usd_per_hour",
    "workers.preemptions_per_hour",
    "workers.local_workers",
)
"""The run settings a launch decides over the run's own (`placed_run_config`; local_workers only with a model)."""
NODE_QUEUE = f"rediss://127.0.0.1:{REDIS_PORT}/0"
"""The coordinator's queue on the reserved node: the Redis its run line starts (password from the node's secret)."""
RUN_CONFIG_ENV = "RUN_CONFIG"
"""The YAMLs' variable naming where the run's config file lands on a node, under the home folder."""
RUN_CONFIG_FILE_ENV = "RUN_CONFIG_FILE"
"""The YAMLs' variable naming the run's config file on the launching machine (their file_mounts' source)."""
RUN_CONFIG_NAME = "run_config.yaml"
"""The file `spotlight launch` writes (in the state folder) and mounts on every node."""
PLACEHOLDER_QUEUE = f"rediss://RESERVED_NODE_IP:{REDIS_PORT}/0"
"""The spot workers' queue before the reserved node has an address (what --dry-run shows; each worker job's ACL user
is added to it)."""
STATE_DIR_ENV = "SPOTLIGHT_STATE_DIR"
"""Folder of what `spotlight launch` keeps on this machine between launches (each run's TLS files)."""
ENV_CACHE_MOUNT = "/spotlight-env-cache"
"""Where every node mounts the store's env-cache/ (sky/setup.sh's ENV_CACHE_DIR)."""
CONTROLLER_FALLBACK = (
    0.192,
    "AWS m6i.xlarge on-demand list price, us-east-1 (approximate): SkyPilot's default jobs controller, 4 vCPUs 16 GB",
)
"""The jobs controller's $/hour where SkyPilot's catalog cannot be read."""


def launch_secrets(env: Mapping[str, str] = os.environ, aws_keys: bool = True) -> dict[str, str]:
    """The secrets every node needs, from this machine's environment; CloudError naming the missing ones. Without
    `aws_keys` (an instance role reaches S3) the AWS keys are neither asked for nor returned. The reward token is
    taken when set (`pipelines/launch_cli.py` refuses a remote reward without it)."""
    try:
        password = redis_password(env)
    except ValueError as err:
        raise CloudError(str(err)) from None
    if password and len(password) < MIN_PASSWORD_CHARS:
        raise CloudError(
            f"{PASSWORD_ENV} is {len(password)} characters: use at least {MIN_PASSWORD_CHARS} (it guards the run's "
            f"Redis and derives every worker's password), e.g. export {PASSWORD_ENV}=$(openssl rand -hex 24)"
        )
    missing = (
        []
        if password
        else [f"{PASSWORD_ENV} (e.g. export {PASSWORD_ENV}=$(openssl rand -hex 24)) or {PASSWORD_FILE_ENV}"]
    )
    names = AWS_KEYS if aws_keys else ()
    missing += [name for name in names if not env.get(name)]
    if missing:
        raise CloudError(
            f"set {' and '.join(missing)} before launching: the nodes get them as SkyPilot secrets "
            "(never on a command line); the AWS keys reach the S3 store (or pass --aws-identity role:PROFILE)"
        )
    token = {REWARD_TOKEN_ENV: env[REWARD_TOKEN_ENV]} if env.get(REWARD_TOKEN_ENV) else {}
    return {PASSWORD_ENV: password, **{name: env[name] for name in names}, **token}


def yaml_task(name: str, secrets: Mapping[str, str], aws_keys: bool = True) -> sky.Task:
    """sky/`name` parsed by SkyPilot with the secrets it declares filled in (`secrets_overrides`, as `--secret NAME`
    does). A YAML's `NAME: null` secret is a managed-secret reference: filled in after parsing (`update_secrets`) the
    reference stays, and SkyPilot's launch refuses it ("No value available for secret(s)"). A declared secret
    missing from `secrets` stays a reference (a dry run without credentials). Without `aws_keys` the AWS keys are
    not declared at all (the nodes reach S3 through an instance role)."""
    config = yaml.safe_load((SKY_DIR / name).read_text())
    if not aws_keys:
        config["secrets"] = {k: v for k, v in (config.get("secrets") or {}).items() if k not in AWS_KEYS}
    declared = list(config.get("secrets") or {})
    given = [(k, secrets[k]) for k in declared if secrets.get(k)]
    return sky.Task.from_yaml_config(config, secrets_overrides=given or None)


def tls_folder(cluster: str, env: Mapping[str, str] = os.environ) -> Path:
    """Where this machine keeps a run's TLS files (0700): $SPOTLIGHT_STATE_DIR (default ~/.spotlight)/CLUSTER/
    redis-tls."""
    return Path(env.get(STATE_DIR_ENV) or "~/.spotlight").expanduser() / cluster / "redis-tls"


def run_config_folder(cluster: str, env: Mapping[str, str] = os.environ) -> Path:
    """Where this machine keeps the config file a launch of `cluster` ships (0700): next to its TLS files."""
    return tls_folder(cluster, env).parent


def with_run_tls(secrets: Mapping[str, str], tls: RunTls) -> dict[str, str]:
    """The launch secrets plus the run's TLS material: the CA for everyone, the server's certificate and key for the
    reserved node only, and, when this machine kept the run's CA key, a client certificate it signs now for the
    workers of a public queue (mutual TLS; each task takes only the secrets its YAML or plan gives it). One
    certificate for the run's workers: Redis 7 maps no certificate to a user, each job still logs in as its own."""
    client = {}
    if tls.ca_key_pem is not None:
        from resources.queue.redis_certs import client_cert

        cert, key = client_cert(tls, CLIENT_CERT_NAME)
        client = {
            CLIENT_CERT_ENV: base64.b64encode(cert).decode("ascii"),
            CLIENT_KEY_ENV: base64.b64encode(key).decode(),
        }
    return {
        **secrets,
        RUN_CA_ENV: tls.b64("ca_pem"),
        CERT_ENV: tls.b64("cert_pem"),
        KEY_ENV: tls.b64("key_pem"),
        **client,
    }


def reserved_node(plan: LaunchPlan, secrets: Mapping[str, str] | None = None) -> sky.Task:
    """sky/reserved.yaml with the plan's accelerators (what the node is priced for), and the Redis port opened only
    for a public queue."""
    task = yaml_task("reserved.yaml", secrets or {}, aws_keys=plan.remote_identity is None)
    template = next(iter(task.resources))  # keep the YAML's autostop
    if plan.reserved_accelerators is not None:
        template = template.copy(accelerators=dict([plan.reserved_accelerators]))
    if plan.public_queue:  # SkyPilot opens it to 0.0.0.0/0: mutual TLS is then the lock (MTLS_ENV)
        template = template.copy(ports=[str(REDIS_PORT)])
    task.set_resources({template})
    return task


def placed_run_config(plan: LaunchPlan, reserved_usd_per_hour: float | None = None) -> RunConfig:
    """The run's tree as the cloud runs it: `plan.run` with what the launch decides placed over it. The reserved
    node is a cloud deployment whose coordinator uses the Redis its run line starts (NODE_QUEUE) and the run folder
    its YAML names (RUN_DIR), samples with a run-long pool of its own workers (never preempted: reserved hardware;
    none with a diffusers pipeline, which the node's trainer holds), and is priced at `reserved_usd_per_hour` (the
    node's GPUs and the jobs controller; None: from the price table)."""
    if reserved_usd_per_hour is None:
        reserved_usd_per_hour = reserved_table_usd_per_hour(reserved_node(plan)) + CONTROLLER_FALLBACK[0]
    run = plan.run
    workers: dict[str, Any] = {"preemptions_per_hour": 0.0}
    if run.model.model is not None:
        workers["local_workers"] = 0
    deployment = {
        "deployment": "cloud",
        "queue": NODE_QUEUE,
        "run_dir": node_run_dir(),
        "ledger": None,
        "rollouts": "local_pool",
        "reserved_usd_per_hour": round(reserved_usd_per_hour, 6),
    }
    try:
        return derive(run, run.preset, deployment=deployment, workers=workers)
    except ValidationError as err:
        placed = ", ".join(f"deployment.{k} {v!r}" for k, v in deployment.items() if k != "reserved_usd_per_hour")
        why = "; ".join(e["msg"].removeprefix("Value error, ") for e in err.errors())
        raise ValueError(
            f"a cloud run has {placed}, {', '.join(f'workers.{k} {v!r}' for k, v in workers.items())}: {why}"
        ) from None


def node_run_dir() -> str:
    """The reserved node's run folder: sky/reserved.yaml's RUN_DIR (relative to the node's workdir)."""
    return str(yaml.safe_load((SKY_DIR / "reserved.yaml").read_text())["envs"]["RUN_DIR"])


def ship_run_config(plan: LaunchPlan, folder: Path, reserved_usd_per_hour: float | None = None) -> Path:
    """Write the tree the nodes run (`placed_run_config`) to `folder`/run_config.yaml, readable by this user only;
    the file every task mounts."""
    for missing in reversed([f for f in (folder, *folder.parents) if not f.exists()]):
        missing.mkdir(mode=0o700, exist_ok=True)  # every folder made here is this user's only, as the TLS files'
    path = folder / RUN_CONFIG_NAME
    text = to_yaml(placed_run_config(plan, reserved_usd_per_hour))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    return path


def reserved_task(plan: LaunchPlan, secrets: Mapping[str, str], run_config: Path) -> sky.Task:
    """sky/reserved.yaml with the plan's accelerators, cap and store (for the archive line), the run's TLS material,
    and the run's config file (`ship_run_config`) mounted where its run line reads it."""
    task = reserved_node(plan, secrets)
    envs = {
        "SPOTLIGHT_STORE": plan.store,
        "MAX_USD": f"{plan.max_usd:g}",
        "REDIS_PORT": str(REDIS_PORT),
        MTLS_ENV: "yes" if plan.public_queue else "no",
        **({RUN_CA_ENV: secrets[RUN_CA_ENV]} if secrets.get(RUN_CA_ENV) else {}),
    }
    return _finish(task, envs, plan, run_config, secrets)


def reserved_accelerators(task: sky.Task) -> tuple[str, int]:
    """The reserved task's one accelerator type and count."""
    ((name, count),) = next(iter(task.resources)).accelerators.items()
    return name, int(count)


def reserved_table_usd_per_hour(task: sky.Task) -> float:
    """The reserved node's on-demand price from the price table (its GPUs only: no host VM)."""
    name, count = reserved_accelerators(task)
    return PriceTable().usd_per_hour(name, spot=False, num_gpus=count)[0]


def worker_task(
    plan: LaunchPlan,
    secrets: Mapping[str, str],
    index: int,
    run_config: Path,
    queue_url: str = PLACEHOLDER_QUEUE,
    usd_per_hour: float | None = None,
    place: NodePlace | None = None,
    user: str | None = None,
) -> sky.Task:
    """sky/spot_workers.yaml as worker `index`'s managed job `CLUSTER-rollout-index`: the reserved node's queue as this
    job's own ACL user `user` (default: a fresh one, resources/queue/redis_acl.py) with that user's password, the
    run's CA, the plan's GPUs, and the run's config file mounted where its run line hands it to the worker (its knobs,
    model and device). The user exists on the node only once granted (`grant_worker_at`). A private queue's worker
    starts in the node's cloud and region (`place`: its network); a public queue's shows a client certificate of the
    run's CA."""
    user = user or worker_user(index, new_nonce())
    if secrets.get(PASSWORD_ENV):
        secrets = {**secrets, PASSWORD_ENV: worker_password(secrets[PASSWORD_ENV], user)}
    task = yaml_task("spot_workers.yaml", secrets, aws_keys=plan.remote_identity is None)
    task.name = worker_job_name(plan.cluster, index)
    count = plan.node_gpus
    names = plan.gpus or tuple(sorted({next(iter(r.accelerators)) for r in task.resources}))
    template = next(iter(task.resources))  # keep the YAML's use_spot and job_recovery
    options = [template.copy(accelerators={gpu: count}) for gpu in names] if plan.gpus or count > 1 else task.resources
    if place is not None and not plan.public_queue:
        options = [r.copy(cloud=place.cloud, region=place.region) for r in options]
    task.set_resources(set(options))
    envs = {
        "SPOTLIGHT_QUEUE": with_user(queue_url, user),
        "SPOTLIGHT_STORE": plan.store,
        **({RUN_CA_ENV: secrets[RUN_CA_ENV]} if secrets.get(RUN_CA_ENV) else {}),
        # The node's spot price for the ledger and the cap, whatever types any_of allows (never the YAML's flat one).
        "USD_PER_HOUR": repr(usd_per_hour if usd_per_hour is not None else _node_usd_per_hour(names, count)),
    }
    if plan.sp_degree not in (None, 1):
        envs["SP_DEGREE"] = str(plan.sp_degree)
    if plan.public_queue:
        task.update_secrets(client_tls(secrets))
    return _finish(task, envs, plan, run_config, secrets)


def client_tls(secrets: Mapping[str, str]) -> dict[str, str]:
    """A public queue's worker secrets: its client certificate and key; CloudError when the launch has none."""
    given = {name: secrets[name] for name in (CLIENT_CERT_ENV, CLIENT_KEY_ENV) if secrets.get(name)}
    if len(given) < 2 and secrets.get(PASSWORD_ENV):
        raise CloudError(
            f"--public-queue needs the workers' client certificate ({CLIENT_CERT_ENV}, {CLIENT_KEY_ENV}), signed by "
            "the run's CA: this machine does not hold that CA's key (the run's TLS files were made before spotlight "
            "kept it). Launch without --public-queue, or as a new run (a new --cluster) whose TLS files are made "
            "now; without it the public port would be guarded by the password alone"
        )
    return given


def _node_usd_per_hour(gpus: tuple[str, ...], count: int) -> float:
    """A node of `count` GPUs of one of `gpus`, at the spot price of the dearest: with several types the ledger cannot
    know which one SkyPilot found, and an SP node's price must not fall back to the YAML's one-GPU default (the spend
    cap reads it), so it errs high."""
    table = PriceTable()
    return round(max(table.usd_per_hour(gpu, spot=True)[0] for gpu in gpus) * count, 6)


def _finish(
    task: sky.Task, envs: Mapping[str, str], plan: LaunchPlan, run_config: Path, secrets: Mapping[str, str]
) -> sky.Task:
    envs = dict(envs)
    if secrets.get(ENV_VERIFY_KEY_ENV):  # sky/setup.sh restores only a cached venv signed by the run's key
        envs[ENV_VERIFY_KEY_ENV] = secrets[ENV_VERIFY_KEY_ENV]
    task.update_file_mounts({"~/" + task.envs[RUN_CONFIG_ENV]: str(run_config)})  # copied to every (new) node
    envs[RUN_CONFIG_FILE_ENV] = str(run_config)  # the YAMLs' file_mounts source, as a launch by hand sets it
    if plan.env_cache:  # sky/setup.sh restores the venv from the store instead of reinstalling on each start
        from sky.data import storage

        cache = {"source": f"{plan.store.rstrip('/')}/env-cache", "mode": "MOUNT", "persistent": True}
        task.update_storage_mounts({ENV_CACHE_MOUNT: storage.Storage.from_yaml_config(cache)})
        envs["ENV_CACHE_DIR"] = ENV_CACHE_MOUNT
    task.update_envs(envs)
    if plan.model_source is not None:  # copied from the bucket when the node starts (and again on recovery)
        task.update_file_mounts({plan.model: plan.model_source})
    task.workdir = str(CHECKOUT)  # the YAMLs' `workdir: .` means the checkout, wherever launch runs from
    return task


def plan_tasks(
    plan: LaunchPlan,
    secrets: Mapping[str, str],
    run_config: Path,
    queue_url: str = PLACEHOLDER_QUEUE,
    usd_per_hour: float | None = None,
    place: NodePlace | None = None,
) -> list[sky.Task]:
    """The reserved node's task, then one task per spot worker: everything `launch` submits, each mounting
    `run_config` (`ship_run_config`)."""
    workers = range(1, plan.spot_workers + 1)
    return [reserved_task(plan, secrets, run_config)] + [
        worker_task(plan, secrets, i, run_config, queue_url, usd_per_hour, place) for i in workers
    ]


def worker_gpus(plan: LaunchPlan) -> tuple[str, ...]:
    """The accelerator types a spot job may get: --gpu's, else sky/spot_workers.yaml's any_of."""
    return plan.gpus or tuple(
        sorted({next(iter(r.accelerators)) for r in yaml_task("spot_workers.yaml", {}).resources})
    )


def describe_task(task: sky.Task) -> dict[str, Any]:
    """A task as plain data for --dry-run: resources, envs, mounts, and secret names only (values shown as ***)."""
    resources = sorted((_describe_resources(r) for r in task.resources), key=lambda r: str(r["accelerators"]))
    declared = set(task.secrets) | {ref.name for ref in task.managed_secret_refs or ()}  # a null secret: a reference
    return {
        "name": task.name,
        "any_of": len(resources) > 1,
        "resources": resources,
        "envs": dict(task.envs),
        "file_mounts": {k: str(v) for k, v in (task.file_mounts or {}).items()},
        "storage_mounts": {k: f"{s.source} ({s.mode.value})" for k, s in (task.storage_mounts or {}).items()},
        "secrets": {
            k: "***" if task.secrets.get(k) is not None and task.secrets[k].get_secret_value() else None
            for k in sorted(declared)
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
