"""Thin Dagster resources over the tensor store, the run ledger and the request queue (the only module here that
imports dagster).

Example:
    defs = Definitions(assets=[...], resources={
        "store": TensorStoreResource(url="runs/demo/store"),
        "ledger": LedgerResource(path="runs/demo/ledger.duckdb"),
        "queue": QueueResource(url="runs/demo/queue.db"),
    })

    @asset
    def weight_patch(store: TensorStoreResource, ledger: LedgerResource) -> None:
        store.get_store().publish_tensors(...)
        ledger.get_ledger().record_sync(...)
"""

from __future__ import annotations

from typing import Optional

from dagster import ConfigurableResource, EnvVar
from pydantic import ConfigDict, Field, field_validator

from resources.ledger import Ledger
from resources.queue import open_queue
from resources.queue.base import QueueConfig, RequestQueue, parse_queue_url
from resources.settings import ROLLOUT_MODES
from resources.store import open_store, parse_store_url
from resources.store.base import TensorStore


def with_env_var(resource: ConfigurableResource, field: str, variable: str) -> ConfigurableResource:
    """A copy of `resource` whose `field` is `EnvVar(variable)`: Dagster resolves it when a run starts and
    stores and shows only the variable's name (a run's job snapshot holds every resource's config)."""
    fields = {name: getattr(resource, name) for name in type(resource).model_fields}
    return type(resource)(**{**fields, field: EnvVar(variable)})


class TensorStoreResource(ConfigurableResource):
    """The run's tensor store, chosen by URL. S3 endpoint and credentials come from boto3's
    standard configuration (AWS_ENDPOINT_URL, AWS_PROFILE, ...), never from Dagster config."""

    url: str = Field(description="A folder path, file:///absolute/path, or s3://bucket/prefix.")

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        parse_store_url(url)  # fail when the definitions load, not mid-run
        return url

    def get_store(self) -> TensorStore:
        """A store client (cheap to create; S3 clients pool their own connections)."""
        return open_store(self.url)


class LedgerResource(ConfigurableResource):
    """The run's DuckDB ledger. Every call opens the file briefly, so the CLI and the
    Dagster UI can read it while a run writes."""

    path: str = Field(description="Path of the run's ledger.duckdb (created if missing).")
    prices_path: Optional[str] = Field(default=None, description="YAML file of GPU prices laid over the defaults.")
    lock_timeout_s: float = Field(
        default=30.0, gt=0, description="Seconds to wait while another process holds the file."
    )

    def get_ledger(self) -> Ledger:
        """A ledger writer; opening it migrates an older schema."""
        return Ledger(self.path, prices_path=self.prices_path, lock_timeout_s=self.lock_timeout_s)


class QueueResource(ConfigurableResource):
    """The run's request queue, chosen by URL: a SQLite file (one machine) or Redis Streams.
    A Redis password comes from the URL or SPOTLIGHT_REDIS_PASSWORD; prefer the variable, so
    the password stays out of Dagster's stored run config."""

    # A rejected URL may hold a password: pydantic would otherwise print it in the error.
    model_config = ConfigDict(hide_input_in_errors=True)

    url: str = Field(
        description="A file path, sqlite:///absolute/path.db, or redis:// / rediss:// (TLS) host:port/db; "
        "the password from SPOTLIGHT_REDIS_PASSWORD or SPOTLIGHT_REDIS_PASSWORD_FILE."
    )
    max_deliveries: int = Field(default=5, ge=1, description="Deliveries before a request goes to the dead letters.")
    connect_timeout_s: float = Field(default=3.0, gt=0, description="Seconds to wait for the queue before failing.")

    @field_validator("url")
    @classmethod
    def _known_queue_scheme(cls, url: str) -> str:
        parse_queue_url(url)  # fail when the definitions load, not mid-run
        return url

    def get_queue(self) -> RequestQueue:
        """A queue client; close it (or use it as a context manager) when done."""
        return open_queue(self.url, QueueConfig(self.max_deliveries, self.connect_timeout_s))


class RolloutWorkersResource(ConfigurableResource):
    """Who samples an iteration's rollout requests.

    - `inprocess`: the trainer itself, batched (no queue; the quickest on one small machine).
    - `local_cluster`: rollout worker processes on this machine for the phase, pulling from the
      queue, with preemptions injected at `preemptions_per_hour` per spot worker.
    - `workers`: workers that already pull from the queue (started by `spotlight run`, by hand
      with `python -m workers.rollout`, or as SkyPilot spot jobs); the phase enqueues and waits.
    """

    mode: str = Field(default="inprocess", description=f"One of {ROLLOUT_MODES}.")
    timeout_s: float = Field(
        default=1800.0, gt=0, description="Longest wait for an iteration's rollouts before the phase fails."
    )
    num_workers: int = Field(default=2, ge=1, description="local_cluster: worker processes.")
    num_reserved: int = Field(
        default=0, ge=0, description="local_cluster: how many of them are reserved (never preempted)."
    )
    preemptions_per_hour: float = Field(
        default=60.0, ge=0, description="local_cluster: preemption rate per spot worker."
    )
    notice_share: float = Field(
        default=0.5, ge=0, le=1, description="local_cluster: share of preemptions that come with a notice."
    )
    commit_every: int = Field(default=2, ge=1, description="Denoising steps between in-flight state commits.")
    lease_s: float = Field(
        default=10.0, gt=0, description="Queue lease: how long a silently killed worker's request waits."
    )
    restart_delay_s: float = Field(
        default=3.0, ge=0, description="local_cluster: seconds until a preempted slot gets a new worker."
    )
    spot_usd_per_hour: float = Field(
        default=0.03, ge=0, description="Price of a spot worker (local: a notional 2-vCPU spot VM)."
    )
    reserved_usd_per_hour: float = Field(default=0.10, ge=0, description="Price of a reserved worker.")
    log_dir: Optional[str] = Field(default=None, description="local_cluster: folder for each worker's stderr.")
    explore: bool = Field(default=True, description="workers: explore the next iteration's seeds beside training.")
    explore_samples: Optional[float] = Field(
        default=None,
        gt=0,
        description="inprocess: explore the next iteration's seeds in process on the stale weights, within this many "
        "full-sampler samples per iteration (a spot pool's budget, made deterministic); unset: no exploration.",
    )

    @field_validator("mode")
    @classmethod
    def _known_mode(cls, mode: str) -> str:
        if mode not in ROLLOUT_MODES:
            raise ValueError(f"unknown rollout mode {mode!r}; choose one of {ROLLOUT_MODES}")
        return mode

    @field_validator("explore_samples")
    @classmethod
    def _inprocess_only(cls, explore_samples: Optional[float], info) -> Optional[float]:
        if explore_samples is not None and info.data.get("mode") != "inprocess":
            raise ValueError(
                f"explore_samples is for mode inprocess, not {info.data.get('mode')!r}: queue workers "
                "explore on their own time (set explore instead)"
            )
        return explore_samples

    @field_validator("num_reserved")
    @classmethod
    def _reserved_fits(cls, num_reserved: int, info) -> int:
        if num_reserved > info.data.get("num_workers", num_reserved):
            raise ValueError(f"num_reserved={num_reserved} exceeds num_workers={info.data.get('num_workers')}")
        return num_reserved
