"""Thin Dagster resources over the tensor store and the run ledger (the only module here that imports dagster).

Example:
    defs = Definitions(assets=[...], resources={
        "store": TensorStoreResource(url="runs/demo/store"),
        "ledger": LedgerResource(path="runs/demo/ledger.duckdb"),
    })

    @asset
    def weight_patch(store: TensorStoreResource, ledger: LedgerResource) -> None:
        store.get_store().publish_tensors(...)
        ledger.get_ledger().record_sync(...)
"""

from __future__ import annotations

from typing import Optional

from dagster import ConfigurableResource
from pydantic import Field, field_validator

from resources.ledger import Ledger
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
