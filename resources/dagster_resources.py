"""Thin Dagster resources over the tensor store, the run ledger and the request queue (the only module here that imports dagster).

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

from dagster import ConfigurableResource
from pydantic import ConfigDict, Field, field_validator

from resources.ledger import Ledger
from resources.queue import QueueConfig, RequestQueue, open_queue, parse_queue_url
from resources.store import TensorStore, open_store, parse_store_url


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
    lock_timeout_s: float = Field(default=30.0, gt=0, description="Seconds to wait while another process holds the file.")

    def get_ledger(self) -> Ledger:
        """A ledger writer; opening it migrates an older schema."""
        return Ledger(self.path, prices_path=self.prices_path, lock_timeout_s=self.lock_timeout_s)


class QueueResource(ConfigurableResource):
    """The run's request queue, chosen by URL: a SQLite file (one machine) or Redis Streams.
    A Redis password comes from the URL or SPOTLIGHT_REDIS_PASSWORD; prefer the variable, so
    the password stays out of Dagster's stored run config."""

    # A rejected URL may hold a password: pydantic would otherwise print it in the error.
    model_config = ConfigDict(hide_input_in_errors=True)

    url: str = Field(description="A file path, sqlite:///absolute/path.db, or redis://[:password@]host:port/db.")
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
