"""Resources wired by deployment: `local` (files on this machine) or `cloud` (S3 + Redis + spot workers on SkyPilot),
from one resolved config tree (resources/settings/).

`spotlight run` builds them from the config it resolved (`build_resources`); `dagster dev` from the preset, the
files named by SPOTLIGHT_CONFIG (a `--config` file, or several separated by the path separator) and SPOTLIGHT_*
variables (`resources_from_env`), checked when the definitions load: an unknown preset, reward, store or queue
scheme fails with what is allowed. Every setting's variable is SPOTLIGHT_<FIELD> (`spotlight config --explain` says
where each value came from). What differs between the deployments:

| variable | local default | cloud |
|---|---|---|
| SPOTLIGHT_DEPLOYMENT | local | cloud |
| SPOTLIGHT_RUN_DIR | runs/run | ledger and report folder on the reserved node |
| SPOTLIGHT_RUN | the run dir's name | run name (store prefix runs/{run}/) |
| SPOTLIGHT_STORE | {run dir}/store | required, s3://bucket/prefix (endpoint, credentials: boto3's configuration) |
| SPOTLIGHT_QUEUE | {run dir}/queue.db | required, redis:// or rediss:// (TLS) host:port/db (password below) |
| SPOTLIGHT_LEDGER | {run dir}/ledger.duckdb | same |
| SPOTLIGHT_ROLLOUTS | local_pool: worker processes per rollout phase in the UI | remote (spot workers pull) |

Give a Redis password in SPOTLIGHT_REDIS_PASSWORD or the file named by SPOTLIGHT_REDIS_PASSWORD_FILE rather than in
the queue URL, so that it stays out of Dagster's stored run config.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from assets.run_config import DAGSTER_SAMPLING_MODES, RunConfigResource
from resources.dagster_resources import LedgerResource, QueueResource, TensorStoreResource
from resources.settings.config import RunConfig
from resources.settings.resolve import save_config

CONFIG_VARIABLE = "SPOTLIGHT_CONFIG"
"""`dagster dev`'s --config: a YAML file of run settings (or several, separated by os.pathsep)."""


class DeploymentError(ValueError):
    """The deployment's configuration cannot work; the message says what to set."""


def build_resources(config: RunConfig, sampling_mode: Optional[str] = None) -> dict:
    """The resource dict of a resolved config (each resource validated as it is built); `sampling_mode` as in
    RunConfigResource.of. DeploymentError saying what to change."""
    d = config.deployment
    if d.deployment == "cloud":
        _check_cloud(d.store, d.queue, d.rollouts)
    run_dir = Path(d.run_dir)
    try:
        run_config = RunConfigResource.of(config, sampling_mode)
        if run_config.sampling.mode != "inprocess":  # queue workers score one request at a time
            from workers.task.rewards import check_per_request_reward

            check_per_request_reward(run_config.train.reward, "a rollout worker")
        return {
            "run_config": run_config,
            "store": TensorStoreResource(url=d.store or str(run_dir / "store")),
            "queue": QueueResource(url=d.queue or str(run_dir / "queue.db")),
            "ledger": LedgerResource(path=d.ledger or str(run_dir / "ledger.duckdb")),
        }
    except ValueError as err:  # pydantic's ValidationError is a ValueError: keep only what the user must fix
        raise DeploymentError(_short(err)) from None


def _check_cloud(store: Optional[str], queue: Optional[str], rollouts: str) -> None:
    """DeploymentError unless the cloud deployment has an S3 store, a Redis queue and remote workers."""
    if not (store or "").startswith("s3://"):
        raise DeploymentError(
            "the cloud deployment needs SPOTLIGHT_STORE=s3://bucket/prefix (got "
            f"{store!r}); endpoint and credentials come from boto3's configuration"
        )
    if not (queue or "").startswith(("redis://", "rediss://")):
        raise DeploymentError(
            "the cloud deployment needs SPOTLIGHT_QUEUE=redis://host:port/db or rediss:// (TLS; the "
            "Redis on the reserved node); put the password in SPOTLIGHT_REDIS_PASSWORD or a file "
            "named by SPOTLIGHT_REDIS_PASSWORD_FILE"
        )


def resolve_env(env: Mapping[str, str] = os.environ):
    """The `Resolved` config `dagster dev` runs, as `spotlight run` resolves it (pipelines/config_cli.py): the preset
    (the `--model` folder's family's when no layer names one), SPOTLIGHT_CONFIG's files, SPOTLIGHT_* variables, then
    what the device decides (pipelines/run_defaults.py)."""
    from pipelines.config_cli import resolve_settings
    from resources.settings.resolve import ConfigError

    files = [Path(p) for p in (env.get(CONFIG_VARIABLE) or "").split(os.pathsep) if p]
    try:
        return resolve_settings({}, files, env=env)
    except ConfigError as err:
        raise DeploymentError(str(err)) from None


def dagster_mode(config: RunConfig) -> str:
    """How a `dagster dev` run samples: what deployment.rollouts means there (DAGSTER_SAMPLING_MODES); in the cloud,
    a pool is the spot workers, which already pull from the queue."""
    d = config.deployment
    if d.deployment == "cloud" and d.rollouts == "local_pool":
        return "workers"
    return DAGSTER_SAMPLING_MODES[d.rollouts]


def resources_from_env(env: Mapping[str, str] = os.environ) -> dict:
    """The resources of the run `dagster dev` would run (checked now), as `build_resources` makes them."""
    config = resolve_env(env).config
    return build_resources(config, dagster_mode(config))


def definitions_resources(env: Mapping[str, str] = os.environ) -> dict:
    """What `dagster dev` loads: `resources_from_env`, with `run_config` the launchpad's: its schema is the tree's
    sections, its defaults the resolved values; a launched run's config is checked again and saved as
    `<run-dir>/config.yaml`."""
    import dagster as dg

    from resources.dagster_resources import tree_schema
    from resources.urls import split_password

    config = resolve_env(env).config
    resources = build_resources(config, dagster_mode(config))

    def launched(init_context) -> RunConfigResource:
        launched_config = RunConfig.model_validate(init_context.resource_config)
        save_config(launched_config)
        return RunConfigResource.of(launched_config, dagster_mode(launched_config))

    shown = config.model_dump()
    if shown["deployment"]["queue"]:  # Dagster stores a run's config: never a password in it
        shown["deployment"]["queue"] = split_password(shown["deployment"]["queue"])[0]
    resources["run_config"] = dg.ResourceDefinition(
        resource_fn=launched,
        config_schema=tree_schema(shown),
        description="The run's config tree (spotlight config prints it): preset, model, train, sampling, explore, "
        "validation, guard, workers, deployment.",
    )
    return resources


def _short(err: ValueError) -> str:
    """pydantic's message without its URL footer and input echo (which could hold a secret)."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        return "; ".join(
            f"{'.'.join(map(str, e.get('loc', ()))) or 'config'}: {e.get('msg', '')}".replace("Value error, ", "")
            for e in errors()
        )
    return str(err)
