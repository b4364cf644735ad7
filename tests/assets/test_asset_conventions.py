"""How the iteration assets present themselves in the Dagster UI: group, owner, kinds, phase tags, table
metadata, and deployment settings as environment variables (their values hidden)."""

from __future__ import annotations

import dagster as dg

from assets import ITERATION_ASSETS
from assets.iteration import GROUP, OWNER, RUN_RESOURCES
from assets.metadata import materialize
from pipelines.definitions import with_env_vars
from tests.runs import run_resources
from workers.coordinator.explore_phases import plan_table
from workers.coordinator.phases import PhaseResult
from workers.explore.seed_plan import SeedPlan


def test_every_asset_has_the_group_an_owner_kinds_a_phase_tag_and_the_five_run_resources() -> None:
    phases = set()
    for asset in ITERATION_ASSETS:
        spec = asset.specs_by_key[asset.key]
        assert spec.group_name == GROUP and list(spec.owners) == [OWNER], asset.key
        assert spec.kinds, asset.key
        phases.add(spec.tags["phase"])
        assert asset.required_resource_keys - {"io_manager"} == RUN_RESOURCES, asset.key  # Dagster adds its own
    assert phases == {"sync", "rollout", "explore", "train", "validate", "report"}


def test_a_seed_plan_shows_as_a_table_with_typed_columns_not_markdown() -> None:
    plan = SeedPlan(0, "ucb", ["a red cube", "two cats"], [[3, 7], [1, 2]], [[0.25, 0.5], None])
    meta = materialize(PhaseResult({"planner": "ucb"}, tables={"plan": plan_table(plan)})).metadata["plan"]
    assert isinstance(meta, dg.TableMetadataValue)
    assert [c.name for c in meta.schema.columns] == ["prompt", "seeds", "explored rewards"]
    assert [r.data for r in meta.records] == [
        {"prompt": "a red cube", "seeds": "3, 7", "explored rewards": "0.25, 0.50"},
        {"prompt": "two cats", "seeds": "1, 2", "explored rewards": ""},
    ]


def test_deployment_variables_reach_dagster_as_env_vars_resolved_at_launch(tmp_path, monkeypatch) -> None:
    queue = "redis://:s3cret@127.0.0.1:6390/0"
    env = {"SPOTLIGHT_QUEUE": queue, "SPOTLIGHT_STORE": str(tmp_path / "store")}
    checked = run_resources(tmp_path, queue=queue, store=env["SPOTLIGHT_STORE"], preset="cpu_smoke")
    resources = with_env_vars(checked, env)
    assert resources["queue"].url == dg.EnvVar("SPOTLIGHT_QUEUE") and "s3cret" not in repr(resources["queue"])
    assert resources["store"].url == dg.EnvVar("SPOTLIGHT_STORE")
    assert resources["ledger"].path == str(tmp_path / "ledger.duckdb")  # no variable: the run folder's default
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with dg.build_resources({"queue": resources["queue"], "store": resources["store"]}) as live:
        assert (live.queue.url, live.store.url) == (queue, env["SPOTLIGHT_STORE"])
