"""The run's config tree, its operational sections: the rollout workers' knobs and where the run's files, queue and
store live (resources/settings/config.py holds the tree; each field is declared once, here or there)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from resources.settings.sections import DeploymentKind, ResidentDtype, Rollouts, Section, _path, _url


class WorkersSection(Section):
    """Every rollout worker's knobs, in one place: local pools, per-phase clusters, the cloud's spot jobs and
    `python -m workers.rollout` all read them from here."""

    local_workers: int = Field(
        2,
        ge=0,
        description="rollouts local_pool / local_cluster: rollout worker processes on this machine, one torch thread "
        "each, on a CPU or MPS run; on CUDA one worker per GPU the trainer leaves, whatever this says (0 only on a "
        "Redis queue: remote workers sample everything).",
    )
    num_reserved: int = Field(0, ge=0, description="local_cluster: how many of them are reserved (never preempted).")
    preemptions_per_hour: float = Field(
        12.0, ge=0, description="Local workers: injected preemptions per spot worker-hour, Poisson (0 = none)."
    )
    notice_share: float = Field(
        0.5, ge=0, le=1, description="Share of injected preemptions that come with a 2 s notice (the rest: SIGKILL)."
    )
    commit_every: int = Field(2, ge=1, description="Denoising steps between in-flight state commits.")
    lease_s: float = Field(
        10.0, gt=0, description="Queue lease in seconds: how long a silently killed worker's request waits."
    )
    restart_delay_s: float = Field(3.0, ge=0, description="Local workers: seconds until a preempted slot restarts.")
    rollout_timeout_s: float = Field(1800.0, gt=0, description="Longest wait for an iteration's rollouts.")
    resident_dtype: ResidentDtype = Field(
        "auto", description="Worker weights: bf16, fp32, or auto (bf16 on CUDA, fp32 elsewhere)."
    )
    worker_threads: int = Field(1, ge=1, description="torch CPU threads per local worker.")
    poll_s: float = Field(0.2, gt=0, description="A worker's wait between claims while the queue is empty.")
    ready_timeout_s: float = Field(180.0, gt=0, description="How long a local worker may take to start.")
    spot_usd_per_hour: float = Field(0.03, ge=0, description="Price of a spot worker (local: a notional spot VM).")


class DeploymentSection(Section):
    """Where the run's state lives and what the trainer's node costs: local files, or S3 + Redis in a cloud."""

    deployment: DeploymentKind = Field("local", description="local (files here) or cloud (S3, Redis, SkyPilot).")
    run_dir: str = Field(
        "runs/run", **_path("Run folder: config.yaml, ledger.duckdb, report/, and the store and queue by default.")
    )
    run: Optional[str] = Field(None, description="Run name: the store prefix and ledger run id (unset: the folder's).")
    store: Optional[str] = Field(None, **_url("Tensor store: a folder or s3://bucket/prefix (unset: RUN_DIR/store)."))
    queue: Optional[str] = Field(
        None,
        **_url(
            "Request queue: a SQLite file or redis(s)://host:port/db (unset: RUN_DIR/queue.db); the Redis password "
            "in SPOTLIGHT_REDIS_PASSWORD(_FILE), not here."
        ),
    )
    ledger: Optional[str] = Field(None, **_path("The ledger's DuckDB file (unset: RUN_DIR/ledger.duckdb)."))
    rollouts: Rollouts = Field(
        "local_pool",
        description="Who samples: local_pool (workers for the whole run), inprocess (the trainer), local_cluster "
        "(workers per phase) or remote (workers already pulling from the queue).",
    )
    anchor_every: int = Field(10, ge=1, description="A full BF16 anchor every this many weight versions.")
    reserved_usd_per_hour: float = Field(
        0.10, ge=0, description="The trainer node's price in USD per hour, for the ledger and the spend cap."
    )
