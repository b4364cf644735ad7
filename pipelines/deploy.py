"""Resources wired by deployment: `local` (the default: files on this machine) or `cloud` (S3 + Redis + workers on
SkyPilot).

Read from the environment when `dagster dev` loads the definitions, or given by
`spotlight run`'s flags. Everything is checked here, at load: an unknown deployment,
preset, reward, store scheme, queue scheme or rollout mode fails with the allowed values.

Every run setting with a variable (resources/settings/: `env_settings()`) is read from SPOTLIGHT_<NAME>
(SPOTLIGHT_PRESET, SPOTLIGHT_LORA_RANK, SPOTLIGHT_ON_HACKING, ...), checked against the setting's type and bounds;
an empty variable is unset. What differs between the deployments:

| variable | local default | cloud |
|---|---|---|
| SPOTLIGHT_DEPLOYMENT | local | cloud |
| SPOTLIGHT_RUN_DIR | runs/dagster | ledger and report folder on the reserved node |
| SPOTLIGHT_RUN | the run dir's name | run name (store prefix runs/{run}/) |
| SPOTLIGHT_STORE | {run dir}/store | required, s3://bucket/prefix (endpoint, credentials: boto3's configuration) |
| SPOTLIGHT_QUEUE | {run dir}/queue.db | required, redis:// or rediss:// (TLS) host:port/db (password below) |
| SPOTLIGHT_LEDGER | {run dir}/ledger.duckdb | same |
| SPOTLIGHT_ROLLOUTS | inprocess | workers (spot workers from sky/spot_workers.yaml pull from the queue) |
| SPOTLIGHT_EXPLORE_SAMPLES | unset (in-process runs do not explore) | unset (the spot workers explore) |
| SPOTLIGHT_MODEL, SPOTLIGHT_PROMPTS, ... (paths) | unset | folders and files on the reserved node (docs/MODELS.md) |

Give a Redis password in SPOTLIGHT_REDIS_PASSWORD or the file named by SPOTLIGHT_REDIS_PASSWORD_FILE rather than in
the queue URL, so that it stays out of Dagster's stored run config.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional

from pydantic import TypeAdapter, ValidationError

from assets.run_config import RunConfigResource, pydantic_type
from resources.dagster_resources import LedgerResource, QueueResource, RolloutWorkersResource, TensorStoreResource
from resources.settings import DEPLOYMENTS, Setting, env_settings, resource_settings
from workers.coordinator.context import run_name_for

DEPLOYMENT_SETTINGS = ("deployment", "run_dir", "run", "store", "queue", "ledger", "sampling")
"""The settings that say where the run's resources live, not how it trains."""


class DeploymentError(ValueError):
    """The deployment's configuration cannot work; the message says what to set."""


def build_resources(
    *,
    deployment: str = "local",
    run_dir: str | Path = "runs/dagster",
    run: Optional[str] = None,
    store: Optional[str] = None,
    queue: Optional[str] = None,
    ledger: Optional[str] = None,
    rollouts: Optional[str] = None,
    workers: Optional[dict] = None,
    validation: Optional[dict] = None,
    **settings: Any,
) -> dict:
    """The resource dict of a deployment (pydantic validates each resource as it is built). `settings`: fields of
    RunConfigResource by name (resources/settings/), None meaning its default; `validation` holds more of them
    (the validation and reward-hacking settings, grouped); `workers`: RolloutWorkersResource's fields."""
    if deployment not in DEPLOYMENTS:
        raise DeploymentError(f"unknown deployment {deployment!r}; choose one of {DEPLOYMENTS}")
    run_dir = Path(run_dir)
    if deployment == "cloud":
        _check_cloud(store, queue)
    given = {k: v for k, v in {**settings, **(validation or {})}.items() if v is not None}
    unknown = sorted(set(given) - {s.name for s in resource_settings()})
    if unknown:
        raise DeploymentError(f"not a run setting: {unknown}")
    default_mode = "workers" if deployment == "cloud" else "inprocess"
    try:
        resources = {
            "run_config": RunConfigResource(run=run or run_name_for(run_dir), **given),
            "store": TensorStoreResource(url=store or str(run_dir / "store")),
            "queue": QueueResource(url=queue or str(run_dir / "queue.db")),
            "ledger": LedgerResource(path=ledger or str(run_dir / "ledger.duckdb")),
            "rollout_workers": RolloutWorkersResource(mode=rollouts or default_mode, **(workers or {})),
        }
        if resources["rollout_workers"].mode != "inprocess":  # queue workers score one request at a time
            from workers.task.rewards import check_per_request_reward

            check_per_request_reward(resources["run_config"].train_config().reward, "a rollout worker")
    except ValueError as err:  # pydantic's ValidationError is a ValueError: keep only what the user must fix
        raise DeploymentError(_short(err)) from None
    return resources


def _check_cloud(store: Optional[str], queue: Optional[str]) -> None:
    """DeploymentError unless the cloud deployment has an S3 store and a Redis queue."""
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


def settings_from_env(env: Mapping[str, str]) -> dict:
    """Each run setting whose SPOTLIGHT_* variable is set (not empty), checked against its type and bounds; paths
    made absolute."""
    values = {}
    for setting in env_settings():
        raw = env.get(setting.env_name)
        if raw:
            values[setting.name] = _env_value(setting, raw)
    return values


def _env_value(setting: Setting, raw: str) -> Any:
    if setting.path:
        return str(Path(raw).expanduser().resolve())
    try:
        return TypeAdapter(pydantic_type(setting)).validate_python(raw)
    except ValidationError as err:  # a value's own error has no field name: the variable names it
        raise DeploymentError(f"{setting.env_name}={raw!r}: {'; '.join(e['msg'] for e in err.errors())}") from None


def resources_from_env(env: Mapping[str, str] = os.environ) -> dict:
    """What `dagster dev` loads: the deployment described by SPOTLIGHT_* variables (table above)."""
    values = settings_from_env(env)
    deployment = {name: values.pop(name, None) for name in DEPLOYMENT_SETTINGS}
    explore_samples = values.pop("explore_samples", None)
    return build_resources(
        deployment=deployment["deployment"] or "local",
        run_dir=deployment["run_dir"] or "runs/dagster",
        run=deployment["run"],
        store=deployment["store"],
        queue=deployment["queue"],
        ledger=deployment["ledger"],
        rollouts=deployment["sampling"],
        workers=None if explore_samples is None else {"explore_samples": explore_samples},
        **values,
    )


def _short(err: ValueError) -> str:
    """pydantic's message without its URL footer and input echo (which could hold a secret)."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        return "; ".join(
            f"{'.'.join(map(str, e.get('loc', ()))) or 'config'}: {e.get('msg', '')}".replace("Value error, ", "")
            for e in errors()
        )
    return str(err)
