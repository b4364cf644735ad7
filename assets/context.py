"""The coordinator's RunContext, built from the Dagster resources an asset is given."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from assets.run_config import RunConfigResource
from resources.dagster_resources import LedgerResource, QueueResource, RolloutWorkersResource, TensorStoreResource
from resources.queue.base import QueueConfig
from workers.coordinator.context import RunContext, Sampling


def run_context(
    run_config: RunConfigResource,
    store: TensorStoreResource,
    ledger: LedgerResource,
    queue: QueueResource,
    rollout_workers: RolloutWorkersResource,
) -> RunContext:
    """The run as the phases see it; the report folder lies next to the ledger (`<run-dir>/report`)."""
    sampling = Sampling(**{f.name: getattr(rollout_workers, f.name) for f in dataclasses.fields(Sampling)})
    train = run_config.train_config()
    return RunContext(
        run=run_config.run,
        preset=run_config.preset,
        train=train,
        store=store.get_store(),
        report_every=run_config.report_every or min(train.validate_every, 5),
        ledger=ledger.get_ledger(),
        report_dir=Path(ledger.path).parent / "report",
        store_url=store.url,
        queue_url=queue.url,
        queue_config=QueueConfig(queue.max_deliveries, queue.connect_timeout_s),
        sampling=sampling,
        checkpoint=run_config.model or run_config.checkpoint,
        model=run_config.model_spec_fields(),
        device=run_config.device,
        validation=run_config.validation_config(),
        hacking=run_config.hacking_config(),
        anchor_every=run_config.anchor_every,
        max_validation_drop=run_config.max_validation_drop,
        reserved_usd_per_hour=run_config.reserved_usd_per_hour,
    )
