"""The coordinator's RunContext, built from the Dagster resources an asset is given."""

from __future__ import annotations

from pathlib import Path

from assets.run_config import RunConfigResource
from resources.dagster_resources import LedgerResource, QueueResource, TensorStoreResource
from resources.queue.base import QueueConfig
from workers.coordinator.context import RunContext


def run_context(
    run_config: RunConfigResource,
    store: TensorStoreResource,
    ledger: LedgerResource,
    queue: QueueResource,
) -> RunContext:
    """The run as the phases see it; the report folder lies next to the ledger (`<run-dir>/report`)."""
    settings, config = run_config.settings, run_config.config
    config_path = Path(config.deployment.run_dir) / "config.yaml"
    return RunContext(
        run=settings.run_name,
        preset=config.preset,
        train=settings.train,
        store=store.get_store(),
        report_every=settings.report_every,
        ledger=ledger.get_ledger(),
        report_dir=Path(ledger.path).parent / "report",
        store_url=store.url,
        queue_url=queue.url,
        queue_config=QueueConfig(queue.max_deliveries, queue.connect_timeout_s),
        sampling=run_config.sampling,
        checkpoint=settings.checkpoint,
        model=settings.model_fields,
        device=config.train.device,
        validation=settings.validation,
        hacking=settings.hacking,
        explore_config=settings.explore,
        anchor_every=config.deployment.anchor_every,
        max_validation_drop=config.validation.max_validation_drop,
        reserved_usd_per_hour=config.deployment.reserved_usd_per_hour,
        config=config,
        config_path=config_path if config_path.is_file() else None,
    )
