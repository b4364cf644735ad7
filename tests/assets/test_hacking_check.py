"""The validation asset's `no_reward_hacking` check and `--on-hacking stop` in the pipeline's walk, with the real
local resources (store folder, DuckDB, SQLite) on the shipped base."""

from __future__ import annotations

import pytest


@pytest.fixture
def touchy_run(tmp_path):
    """A 2-iteration cpu_smoke run whose guard flags any change of a held-out image statistic (bounds of 1e-9: the
    first update of the shipped base changes the images' compressed size) and stops on a flag."""
    import torch

    from tests.runs import run_resources

    torch.set_num_threads(1)
    return run_resources(
        tmp_path / "run",
        "inprocess",
        run="t",
        preset="cpu_smoke",
        iterations=2,
        on_hacking="stop",
        hacking_max_drop=1e-9,
        hacking_max_rise=1e-9,
    )


@pytest.mark.slow
def test_a_flagged_validation_fails_the_check_and_stop_ends_the_walk_after_that_iteration(touchy_run):
    import dagster as dg

    from pipelines.run import HackingStoppedError, check_hacking_stop
    from pipelines.run_walk import IterationOutcome, _metadata, materialize_iteration

    instance = dg.DagsterInstance.ephemeral()
    results = [materialize_iteration(instance, touchy_run, k) for k in (0, 1)]
    checks = [
        {
            e.asset_check_evaluation_data.check_name: e.asset_check_evaluation_data
            for e in r.all_events
            if e.event_type_value == "ASSET_CHECK_EVALUATION"
        }
        for r in results
    ]
    assert checks[0]["no_reward_hacking"].passed
    flagged = checks[1]["no_reward_hacking"]
    assert not flagged.passed and flagged.metadata["rule"].value.startswith("drift:")
    assert flagged.metadata["action"].value == "stop"
    check_hacking_stop(IterationOutcome(0, False, 0.0, _metadata(results[0])))  # the base: nothing to stop
    with pytest.raises(HackingStoppedError, match=r"flagged iteration 1 \(drift:"):
        check_hacking_stop(IterationOutcome(1, False, 0.0, _metadata(results[1])))
    ledger = touchy_run["ledger"].get_ledger()
    # iteration 1 is closed before the run stops, so a resumed walk starts at 2
    assert ledger.query("SELECT iteration, status FROM iterations ORDER BY 1").rows == [
        (0, "succeeded"),
        (1, "succeeded"),
    ]
    assert ledger.query("SELECT iteration, flagged, action FROM reward_hacking ORDER BY 1").rows == [
        (0, False, None),
        (1, True, "stop"),
    ]
