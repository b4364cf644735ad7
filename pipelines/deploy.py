"""Resources wired by deployment: `local` (the default: files on this machine) or `cloud` (S3 + Redis + workers on SkyPilot).

Read from the environment when `dagster dev` loads the definitions, or given by
`spotlight run`'s flags. Everything is checked here, at load: an unknown deployment,
preset, reward, store scheme, queue scheme or rollout mode fails with the allowed values.

| variable | local default | cloud |
|---|---|---|
| SPOTLIGHT_DEPLOYMENT | local | cloud |
| SPOTLIGHT_RUN_DIR | runs/dagster | ledger and report folder on the reserved node |
| SPOTLIGHT_RUN | the run dir's name | run name (store prefix runs/{run}/) |
| SPOTLIGHT_PRESET / _ITERATIONS / _REWARD | cpu_tiny / the preset's / the preset's | same |
| SPOTLIGHT_STORE | {run dir}/store | required, s3://bucket/prefix (endpoint, credentials: boto3's configuration) |
| SPOTLIGHT_QUEUE | {run dir}/queue.db | required, redis:// or rediss:// (TLS) host:port/db (password: SPOTLIGHT_REDIS_PASSWORD or the file named by SPOTLIGHT_REDIS_PASSWORD_FILE) |
| SPOTLIGHT_LEDGER | {run dir}/ledger.duckdb | same |
| SPOTLIGHT_ROLLOUTS | inprocess | workers (spot workers from sky/spot_workers.yaml pull from the queue) |
| SPOTLIGHT_EXPLORE_SAMPLES | unset (in-process runs do not explore) | unset (the spot workers explore) |
| SPOTLIGHT_DEVICE | cpu | the trainer's device on the reserved node (cuda) |
| SPOTLIGHT_MODEL / _LORA_RANK / _RESOLUTION / _GUIDANCE / _SYNC_MODE | unset (the pixel policy) | a diffusers pipeline folder on every node (docs/MODELS.md) |
| SPOTLIGHT_PROMPTS / _PROMPTS_HELDOUT | unset (MiniGenEval's grammar) | the training prompts file on the reserved node, and the share held out |
| SPOTLIGHT_VALIDATION_REWARD / _PROMPTS | unset (the detector, or with a model the run's reward; MiniGenEval's held-out prompts) | a reward spec; a prompts file on the reserved node |
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

from assets.run_config import RunConfigResource
from resources.dagster_resources import LedgerResource, QueueResource, RolloutWorkersResource, TensorStoreResource
from workers.coordinator.context import run_name_for

DEPLOYMENTS = ("local", "cloud")


class DeploymentError(ValueError):
    """The deployment's configuration cannot work; the message says what to set."""


def build_resources(
    *,
    deployment: str = "local",
    run_dir: str | Path = "runs/dagster",
    run: Optional[str] = None,
    preset: str = "cpu_tiny_spot",
    iterations: Optional[int] = None,
    seed: Optional[int] = None,
    reward: Optional[str] = None,
    store: Optional[str] = None,
    queue: Optional[str] = None,
    ledger: Optional[str] = None,
    rollouts: Optional[str] = None,
    checkpoint: Optional[str] = None,
    workers: Optional[dict] = None,
    model: Optional[dict] = None,
    device: str = "cpu",
    validation: Optional[dict] = None,
    prompts: Optional[dict] = None,
    batch: Optional[dict] = None,
) -> dict:
    """The resource dict of a deployment (pydantic validates each resource as it is built). batch: the run's
    batch-shape fields (rollout_batch, micro_batch, group_size, prompts_per_iteration, minibatches) and advantage."""
    if deployment not in DEPLOYMENTS:
        raise DeploymentError(f"unknown deployment {deployment!r}; choose one of {DEPLOYMENTS}")
    run_dir = Path(run_dir)
    if deployment == "cloud":
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
    default_mode = "workers" if deployment == "cloud" else "inprocess"
    try:
        resources = {
            "run_config": RunConfigResource(
                run=run or run_name_for(run_dir),
                preset=preset,
                iterations=iterations,
                seed=seed,
                reward=reward,
                checkpoint=checkpoint,
                device=device,
                **(model or {}),
                **(validation or {}),
                **(prompts or {}),
                **(batch or {}),
            ),
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


def resources_from_env(env: Mapping[str, str] = os.environ) -> dict:
    """What `dagster dev` loads: the deployment described by SPOTLIGHT_* variables (table above)."""
    iterations = env.get("SPOTLIGHT_ITERATIONS")
    if iterations is not None and not iterations.isdigit():
        raise DeploymentError(f"SPOTLIGHT_ITERATIONS must be a positive integer, got {iterations!r}")
    return build_resources(
        deployment=env.get("SPOTLIGHT_DEPLOYMENT", "local"),
        run_dir=env.get("SPOTLIGHT_RUN_DIR", "runs/dagster"),
        run=env.get("SPOTLIGHT_RUN"),
        preset=env.get("SPOTLIGHT_PRESET", "cpu_tiny_spot"),
        iterations=int(iterations) if iterations else None,
        reward=env.get("SPOTLIGHT_REWARD"),
        store=env.get("SPOTLIGHT_STORE"),
        queue=env.get("SPOTLIGHT_QUEUE"),
        ledger=env.get("SPOTLIGHT_LEDGER"),
        rollouts=env.get("SPOTLIGHT_ROLLOUTS"),
        checkpoint=env.get("SPOTLIGHT_CHECKPOINT"),
        model=_model_env(env),
        device=env.get("SPOTLIGHT_DEVICE", "cpu"),
        workers=_workers_env(env),
        validation={
            f"validation_{name}": env[f"SPOTLIGHT_VALIDATION_{name.upper()}"]
            for name in ("reward", "prompts")
            if env.get(f"SPOTLIGHT_VALIDATION_{name.upper()}")
        },
        prompts=_prompts_env(env),
    )


def _prompts_env(env: Mapping[str, str]) -> dict:
    """SPOTLIGHT_PROMPTS (a training prompts file) and SPOTLIGHT_PROMPTS_HELDOUT (the share held out)."""
    out: dict = {}
    if env.get("SPOTLIGHT_PROMPTS"):
        out["prompts"] = str(Path(env["SPOTLIGHT_PROMPTS"]).expanduser().resolve())
    if env.get("SPOTLIGHT_PROMPTS_HELDOUT"):
        try:
            out["prompts_heldout"] = float(env["SPOTLIGHT_PROMPTS_HELDOUT"])
        except ValueError:
            raise DeploymentError(
                f"SPOTLIGHT_PROMPTS_HELDOUT must be a number in [0, 1), got {env['SPOTLIGHT_PROMPTS_HELDOUT']!r}"
            ) from None
    return out


def _workers_env(env: Mapping[str, str]) -> Optional[dict]:
    """SPOTLIGHT_EXPLORE_SAMPLES: in-process exploration's budget in samples per iteration."""
    raw = env.get("SPOTLIGHT_EXPLORE_SAMPLES")
    if not raw:
        return None
    try:
        return {"explore_samples": float(raw)}
    except ValueError:
        raise DeploymentError(f"SPOTLIGHT_EXPLORE_SAMPLES must be a number of samples, got {raw!r}") from None


def _model_env(env: Mapping[str, str]) -> dict:
    """SPOTLIGHT_MODEL (a diffusers pipeline folder) and its SPOTLIGHT_LORA_RANK / _RESOLUTION / _GUIDANCE /
    _SYNC_MODE (lora or merged)."""
    out: dict = {}
    if env.get("SPOTLIGHT_MODEL"):
        out["model"] = str(Path(env["SPOTLIGHT_MODEL"]).expanduser().resolve())
    for name, kind in (("lora_rank", int), ("resolution", int), ("guidance", float), ("sync_mode", str)):
        raw = env.get(f"SPOTLIGHT_{name.upper()}")
        if raw:
            try:
                out[name] = kind(raw)
            except ValueError:
                raise DeploymentError(f"SPOTLIGHT_{name.upper()} must be a {kind.__name__}, got {raw!r}") from None
    return out


def _short(err: ValueError) -> str:
    """pydantic's message without its URL footer and input echo (which could hold a secret)."""
    errors = getattr(err, "errors", None)
    if callable(errors):
        return "; ".join(
            f"{'.'.join(map(str, e.get('loc', ()))) or 'config'}: {e.get('msg', '')}".replace("Value error, ", "")
            for e in errors()
        )
    return str(err)
