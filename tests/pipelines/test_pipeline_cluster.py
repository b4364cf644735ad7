"""The rollout phase through the queue and a local cluster of rollout worker processes."""

from __future__ import annotations

import pytest


@pytest.mark.slow
def test_rollouts_through_a_local_cluster_land_in_store_and_ledger(tmp_path, tiny_policy):
    import dagster as dg

    from pipelines.run_walk import materialize_iteration
    from resources.keys import rollouts_prefix
    from tests.runs import run_resources
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "tiny")
    resources = run_resources(
        tmp_path / "run",
        "local_cluster",
        run="c",
        preset="cpu_smoke",
        iterations=1,
        checkpoint=str(tmp_path / "tiny"),
        local_workers=2,
        num_reserved=1,
        preemptions_per_hour=0.0,
    )
    result = materialize_iteration(dg.DagsterInstance.ephemeral(), resources, 0)
    assert result.success
    assert len(resources["store"].get_store().list_commits(rollouts_prefix("c", 0))) == 8
    ledger = resources["ledger"].get_ledger()
    workers = ledger.query("SELECT worker_id, spot, end_reason FROM workers WHERE role = 'rollout' ORDER BY 1").rows
    assert workers == [("it0w0.0", False, "finished"), ("it0w1.0", True, "finished")]
    producers = {r[0] for r in ledger.query("SELECT DISTINCT worker_id FROM requests").rows}
    assert producers <= {"it0w0.0", "it0w1.0"} and producers
    assert ledger.query("SELECT usd_spot > 0, usd_reserved > 0 FROM cost_per_iteration").rows == [(True, True)]


def test_default_run_shows_preemptions_and_spot_cost_in_summary_and_report(smoke_cluster_run):
    """The session's one-iteration run on the default local cluster at 120 preemptions per worker-hour: seed 0's
    trace kills a worker 0.3 s after the cluster is ready, then about every 30 s."""
    from resources.ledger.db import query_ledger

    run = smoke_cluster_run.path("rel/cluster")

    def rows(sql: str) -> list:
        return query_ledger(run / "ledger.duckdb", sql).rows

    assert rows("SELECT count(*) > 0 FROM preemptions") == [(True,)]
    assert rows("SELECT count(*), count(result_hash) FROM requests WHERE kind = 'rollout'") == [(8, 8)]
    assert rows("SELECT iteration, usd_spot > 0, usd_reserved > 0 FROM cost_per_iteration ORDER BY 1") == [
        (0, True, True),
        (1, True, True),
    ]
    # cpu_smoke's validation_max_prompts reached the run: 16 held-out prompts, every category's share of them.
    assert rows("SELECT iteration, num_prompts FROM validation ORDER BY 1") == [(0, 16), (1, 16)]
    categories = "SELECT criterion FROM validation_scores WHERE iteration = 0 AND criterion LIKE 'category.%'"
    assert len(rows(categories)) == 4
    assert "preempt." in smoke_cluster_run.stdout and "$ spot" in smoke_cluster_run.stdout  # the summary table
    page = (run / "report" / "index.html").read_text()
    assert 'src="preemptions.png"' in page and 'src="cost.png"' in page
