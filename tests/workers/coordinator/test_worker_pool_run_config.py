"""A run's worker pool handed the run's saved config takes every knob from it: its workers get the file, and the
ledger prices them at the file's spot price."""

from __future__ import annotations

import pytest

from resources.settings.resolve import file_layer, resolve, to_yaml
from workers.coordinator.context import RunContext
from workers.coordinator.worker_pool import worker_pool
from workers.trainer.presets import PRESETS, get_preset


@pytest.mark.slow
def test_a_pool_given_the_runs_config_prices_and_configures_its_workers_from_it(tmp_path) -> None:
    (tmp_path / "run.yaml").write_text("workers:\n  spot_usd_per_hour: 0.07\n  lease_s: 7\n")
    saved = tmp_path / "config.yaml"
    saved.write_text(to_yaml(resolve([file_layer(tmp_path / "run.yaml")], PRESETS).config))
    ctx = RunContext.local(tmp_path / "run", "pool", "cpu_smoke", get_preset("cpu_smoke"), report=False)
    ctx.queue_url = str(tmp_path / "queue.db")
    with worker_pool(ctx, 1, 0.0, tmp_path / "logs", run_config=saved):
        pass
    rows = ctx.ledger.query("SELECT worker_id, usd_per_hour FROM workers WHERE role = 'rollout'").rows
    assert [price for _, price in rows] == [0.07]  # the file's price, not the run's sampling default (0.03)
