"""`spotlight launch`, `spotlight status`, `spotlight down`: the cloud path on SkyPilot (registered in
pipelines/cli.py).

Only typer at import time; SkyPilot (resources/cloud/__init__.py) loads inside the commands, so
`--help` stays instant. Every flag and secret is checked before anything is submitted. `launch` declares only the
cloud's own options; the run's settings come from the config tree (`--config FILE`, SPOTLIGHT_* variables and every
setting's flag), are resolved once here and shipped whole to every node.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

import typer

from pipelines.launch_config import resolve_launch_run
from pipelines.launch_steps import aws_identity as _aws_identity
from pipelines.launch_steps import check_reward_chosen as _check_reward_chosen
from pipelines.launch_steps import check_reward_token as _check_reward_token
from pipelines.launch_steps import run_keys as _run_keys
from pipelines.launch_steps import sp_degree as _sp_degree
from pipelines.launch_steps import spot_workers as _spot_workers


def _fail(command: str, err: Exception) -> None:
    typer.echo(f"spotlight {command}: {err}", err=True)
    raise typer.Exit(1)


def launch_command(
    ctx: typer.Context,
    config: Optional[Path] = typer.Option(
        None,
        "--config",
        help="The run's settings as YAML (nested or dotted keys, as spotlight run --config takes them): resolved here "
        "and shipped whole to every node.",
    ),
    spot_workers: Optional[int] = typer.Option(
        None,
        "--spot-workers",
        help="Spot rollout workers (SP nodes with --sp-degree), one SkyPilot managed job each (required).",
    ),
    gpu: Optional[str] = typer.Option(
        None,
        "--gpu",
        help=(
            "Spot worker accelerator(s), comma-separated (e.g. A100 or L4,A10G); default: sky/spot_workers.yaml's "
            "any_of."
        ),
    ),
    max_usd: float = typer.Option(
        100.0,
        "--max-usd",
        help=(
            "Spend cap in dollars: the coordinator stops and spot jobs stop recovering once the ledger's spend "
            "reaches it."
        ),
    ),
    cluster: str = typer.Option("spotlight-reserved", help="Name of the reserved node's SkyPilot cluster."),
    model_source: Optional[str] = typer.Option(
        None,
        "--model-source",
        help=(
            "A bucket URL holding the --model folder (s3://bucket/models/Qwen-Image): SkyPilot copies it to that path"
            " on every node at start."
        ),
    ),
    sp_degree: Optional[str] = typer.Option(
        None,
        "--sp-degree",
        help=(
            "SP nodes instead of rollout workers: each job runs the elastic SP node agent over its node's GPUs, "
            "sampling in Ulysses groups of this many GPUs (2..8), or auto (per round). Checked against --model's "
            "transformer when the folder is on this machine. Default: one rollout worker per job."
        ),
    ),
    gpus_per_node: Optional[int] = typer.Option(
        None, "--gpus-per-node", help="GPUs of each SP node (default: the --sp-degree)."
    ),
    reserved_gpus: Optional[str] = typer.Option(
        None,
        "--reserved-gpus",
        help=(
            "The reserved node's accelerators, NAME[:COUNT] (e.g. H100:8); default: sky/reserved.yaml's. Priced "
            "on-demand from SkyPilot's catalog."
        ),
    ),
    aws_identity: str = typer.Option(
        "auto",
        "--aws-identity",
        help=(
            "How the nodes reach S3: role:PROFILE (your IAM instance profile; no AWS keys on any node), "
            "service-account (SkyPilot's IAM role) or keys (AWS_ACCESS_KEY_ID/SECRET as SkyPilot secrets, on every "
            "spot VM). auto: the role SkyPilot's config names (aws.remote_identity); refused where it names none."
        ),
    ),
    public_queue: bool = typer.Option(
        False,
        "--public-queue",
        help=(
            "Open the reserved node's Redis port to the internet (SkyPilot's ports:, 0.0.0.0/0), with mutual TLS. "
            "Default: workers reach it on its private address, in its region and security group."
        ),
    ),
    print_env: bool = typer.Option(
        False,
        "--print-env",
        help=(
            "Submit nothing: write each task's --env-file and --secret-file (0600, in ~/.spotlight/CLUSTER) and print "
            "the `sky launch` / `sky jobs launch` commands that run sky/*.yaml by hand with them."
        ),
    ),
    env_cache: bool = typer.Option(
        True,
        "--env-cache/--no-env-cache",
        help=(
            "Mount the store's env-cache/ on every node: sky/setup.sh restores the venv from there instead of "
            "reinstalling."
        ),
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the run's config tree (run_config) and the tasks as one JSON object (secret values hidden) and "
        "submit nothing.",
    ),
) -> None:
    """Start the reserved node (Redis, coordinator, trainer) with sky.launch, then N spot workers as managed jobs,
    every node running the same resolved config file."""
    from resources.cloud import CloudError, LaunchPlan, launch, placed_run_config, use_run_ca
    from resources.settings.resolve import ConfigError

    try:
        plan = LaunchPlan(
            spot_workers=_spot_workers(spot_workers, ctx.args),
            run=resolve_launch_run(config, ctx.args, os.environ),
            gpus=tuple(g.strip() for g in gpu.split(",")) if gpu else (),
            max_usd=max_usd,
            cluster=cluster,
            model_source=model_source,
            sp_degree=_sp_degree(sp_degree),
            gpus_per_node=gpus_per_node,
            reserved_gpus=reserved_gpus,
            aws_identity=_aws_identity(aws_identity),
            env_cache=env_cache,
            public_queue=public_queue,
        )
        placed_run_config(plan)  # what the cloud decides must hold with the run's other settings
        _check_sp_against_model(plan)
        _check_reward_chosen(plan)
    except (ConfigError, ValueError) as err:
        raise typer.BadParameter(str(err)) from None
    secrets = _launch_secrets(plan, dry_run)
    if print_env:
        from pipelines.launch_steps import print_env as _print_env

        try:
            _print_env(plan, secrets, typer.echo)
        except CloudError as err:
            _fail("launch", err)
        return
    if dry_run:
        _print_dry_run(plan, secrets)
        return
    use_run_ca(cluster, client_cert=public_queue)  # the spend-cap check reads the queue from here too
    try:
        queue_url = launch(plan, secrets, before_workers=lambda url: _refuse_over_budget(url, max_usd), echo=typer.echo)
    except CloudError as err:
        _fail("launch", err)
    follow = f"spotlight status --cluster {cluster}" + (" --public-queue" if public_queue else "")
    typer.echo(f"the workers' queue {queue_url}; follow the run with: {follow}")


def _launch_secrets(plan, dry_run: bool) -> dict[str, str]:
    """The launch's secrets from this environment, with the run's CA, Redis certificate and env-cache key (kept on
    this machine: a relaunch reuses them; a dry run's are thrown away); exits on what would stop a real launch, and a
    dry run goes on without secrets."""
    from resources.cloud import CloudError, launch_secrets
    from resources.cloud.tasks import client_tls

    try:
        secrets = launch_secrets(os.environ, aws_keys=plan.remote_identity is None)
        _check_reward_token(plan, secrets)
    except CloudError as err:
        if not dry_run:
            _fail("launch", err)
        typer.echo(f"# not ready to launch: {err}", err=True)
        return {}
    if not secrets:
        return {}
    secrets = _run_keys(secrets, plan.cluster, throwaway=dry_run)
    if plan.public_queue:
        try:
            client_tls(secrets)  # mutual TLS, or no public port
        except CloudError as err:
            _fail("launch", err)
    return secrets


def _print_dry_run(plan, secrets: dict[str, str]) -> None:
    """--dry-run: the run's config tree as the cloud runs it and each task launch would submit, as one JSON line."""
    from resources.cloud import describe_task, placed_run_config, plan_tasks, run_config_folder, ship_run_config

    folder = run_config_folder(plan.cluster) / "dry-run"  # beside the live run's file, never over it
    tasks = plan_tasks(plan, secrets, ship_run_config(plan, folder))
    shown = {"run_config": placed_run_config(plan).model_dump(mode="json"), "tasks": list(map(describe_task, tasks))}
    typer.echo(json.dumps(shown, sort_keys=True))


def _check_sp_against_model(plan) -> None:
    """ValueError when --model's folder is on this machine and its transformer cannot be split --sp-degree ways (auto:
    any degree from 2 to the node's GPUs), from its config files alone. A folder only on the nodes is probed there."""
    if plan.sp_degree in (None, 1) or plan.model is None:
        return
    if not (Path(plan.model) / "model_index.json").is_file():
        typer.echo(
            f"# --sp-degree {plan.sp_degree} not checked against --model: {plan.model} is not on this machine "
            "(each node probes it and gives back what its groups cannot split)",
            err=True,
        )
        return
    from workers.sp.model_sp import check_folder_degree
    from workers.trainer.from_config import model_spec_fields

    fields = model_spec_fields(plan.run)  # the run's resolution
    degrees = [plan.sp_degree] if plan.sp_degree != "auto" else range(2, plan.node_gpus + 1)
    errors = []
    for degree in degrees:
        try:
            check_folder_degree(plan.model, degree, fields)
            return
        except ValueError as err:
            errors.append(err)
    if plan.sp_degree != "auto":
        raise errors[0]
    raise ValueError(
        f"--sp-degree auto: no degree from 2 to {plan.node_gpus} splits {plan.model} ({errors[0]}); "
        "launch rollout workers (no --sp-degree) instead"
    )


def _refuse_over_budget(queue_url: str, max_usd: float) -> None:
    """A relaunch of a run that already spent its cap submits no more workers."""
    from resources.cloud import CloudError
    from resources.run_status import over_budget

    info = _queue_info(queue_url)
    if info is not None and over_budget(info, max_usd):
        raise CloudError(
            f"the run already spent ${info['usd_total']:.2f} of --max-usd {max_usd:g}: no spot workers "
            "submitted; raise --max-usd to continue, or `spotlight down`"
        )


def _queue_info(queue_url: str) -> Optional[dict]:
    """The queue's depth and the coordinator's published summary; None when the queue cannot be reached."""
    from resources.queue import open_queue
    from resources.queue.base import QueueError

    try:
        with open_queue(queue_url) as queue:
            stats = queue.stats()
            info = queue.info() if hasattr(queue, "info") else {}
    except (ValueError, QueueError):
        return None
    return {**info, "queue_pending": stats.pending, "queue_leased": stats.leased, "queue_done": stats.done}


def status_command(
    queue: Optional[str] = typer.Option(
        None,
        "--queue",
        help=(
            "The run's queue (default: rediss:// on the reserved node, from SkyPilot, trusting the run's CA kept by "
            "spotlight launch). Password from SPOTLIGHT_REDIS_PASSWORD(_FILE)."
        ),
    ),
    ledger: Optional[Path] = typer.Option(
        None,
        "--ledger",
        help=(
            "Read iteration, score, spend and workers from this ledger file instead of the coordinator's summary in "
            "the queue."
        ),
    ),
    cluster: str = typer.Option("spotlight-reserved", help="Name of the reserved node's SkyPilot cluster."),
    public_queue: bool = typer.Option(
        False, "--public-queue", help="The run was launched with --public-queue (else: an SSH tunnel to the node)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object."),
) -> None:
    """Workers, queue depth, iteration, held-out score and dollars so far, from the ledger and the queue."""
    from resources.cloud import CloudError

    record: dict = {}
    try:
        if ledger is not None:
            from resources.ledger.db import query_ledger
            from resources.run_status import ledger_status

            record.update(ledger_status(lambda sql: query_ledger(ledger, sql)))
        if queue is None and ledger is None:
            from resources.cloud import launcher_route, node_place, use_run_ca, worker_jobs

            if not use_run_ca(cluster, client_cert=public_queue):  # mutual TLS: the run's client certificate
                raise CloudError(
                    f"no TLS files of {cluster!r} on this machine (spotlight launch keeps them under "
                    "$SPOTLIGHT_STATE_DIR, default ~/.spotlight): set SPOTLIGHT_REDIS_RUN_CA, or pass --queue"
                )
            node_place(cluster)  # CloudError naming the cluster when SkyPilot does not know it
            record["spot_jobs"] = worker_jobs(cluster, echo=lambda note: typer.echo(note, err=True))
            with launcher_route(cluster, public_queue) as address:  # a private queue: an SSH tunnel to the node
                record = {**_read_queue(f"rediss://{address}/0"), **record}
        elif queue is not None:
            record = {**_read_queue(queue), **record}  # the ledger, when given, is the truth
    except (CloudError, FileNotFoundError) as err:
        _fail("status", err)
    typer.echo(json.dumps(record, sort_keys=True, default=str) if as_json else _status_text(record))


def _read_queue(queue: str) -> dict:
    """_queue_info, or CloudError saying what to check."""
    from resources.cloud import CloudError

    info = _queue_info(queue)
    if info is None:
        raise CloudError(
            f"cannot read the queue {_shown(queue)} (is the reserved node up, and "
            "SPOTLIGHT_REDIS_PASSWORD set to its password?)"
        )
    return info


def _shown(queue: str) -> str:
    """The queue URL without a password it may hold (a status line must not print it)."""
    from resources.queue import parse_queue_url

    try:
        where = parse_queue_url(queue)
    except ValueError:
        return "(an unreadable queue URL)"
    return str(getattr(where, "url", where))


def _status_text(r: dict) -> str:
    def num(key: str, fmt: str) -> str:
        return "-" if r.get(key) is None else format(r[key], fmt)

    lines = [
        f"iteration {num('iteration', 'd')}  held-out {num('heldout_score', '.3f')}  spent ${num('usd_total', '.2f')}"
        + (f" of ${r['max_usd']:g}" if r.get("max_usd") else ""),
        f"workers alive {num('workers_alive', 'd')} ({num('spot_workers_alive', 'd')} spot), "
        f"preemptions {num('preemptions', 'd')}",
    ]
    if "queue_pending" in r:
        lines.append(f"queue: {r['queue_pending']} pending, {r['queue_leased']} leased, {r['queue_done']} done")
    for job in r.get("spot_jobs", []):
        lines.append(f"  {job['name']}  job {job['job_id']}  {job['status']}")
    return "\n".join(lines)


def down_command(
    cluster: str = typer.Option("spotlight-reserved", help="Name of the reserved node's SkyPilot cluster."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
) -> None:
    """Cancel this run's spot worker jobs (CLUSTER-rollout-N: no other run's) and take its reserved node down (its
    disk, with the ledger, goes too)."""
    if not yes:
        typer.confirm(
            f"cancel {cluster}'s {cluster}-rollout-* jobs and take {cluster} down (its disk is deleted)?", abort=True
        )
    from resources.cloud import CloudError, check_clouds, teardown

    try:
        check_clouds()
        teardown(cluster, echo=typer.echo)
    except CloudError as err:
        _fail("down", err)
