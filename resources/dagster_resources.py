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

from dagster import Any as Any_
from dagster import Array, Bool, ConfigurableResource, EnvVar, Float, Int, Noneable, Shape, String
from dagster import Field as Field_
from pydantic import ConfigDict, Field, field_validator

from resources.ledger import Ledger
from resources.queue import open_queue
from resources.queue.base import QueueConfig, RequestQueue, parse_queue_url
from resources.store import open_store, parse_store_url
from resources.store.base import TensorStore

_SCALARS = {int: Int, float: Float, str: String, bool: Bool}


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


def tree_schema(values: dict) -> dict:
    """The Dagster config schema of the run's config tree (resources/settings/config.py): one Shape per section,
    each field with its type, its description and the value in `values` (a resolved config's `model_dump`) as its
    default, so the launchpad shows the tree's sections with the run's values. pydantic checks the result."""
    from resources.settings.fields import LEAVES

    sections: dict[str, dict] = {}
    top: dict = {}
    for leaf in LEAVES.values():
        value = values[leaf.section][leaf.name] if leaf.section else values[leaf.name]
        field = Field_(_dagster_type(leaf), default_value=_plain(value), is_required=False, description=leaf.help)
        (sections.setdefault(leaf.section, {}) if leaf.section else top)[leaf.name] = field
    for name, fields in sections.items():
        shown = {k: _plain(v) for k, v in values[name].items()}
        top[name] = Field_(Shape(fields), is_required=False, default_value=shown)
    return top


def _plain(value):
    return list(value) if isinstance(value, tuple) else value


def _dagster_type(leaf):
    import typing

    inner = leaf.inner
    origin = typing.get_origin(inner)
    if origin is tuple:
        args = [a for a in typing.get_args(inner) if a is not Ellipsis]
        kind = Array(_SCALARS.get(args[0], Any_))
    elif origin is typing.Literal:
        kind = String
    else:
        kind = _SCALARS.get(inner, Any_)
    return Noneable(kind) if leaf.optional else kind
