"""The ledger answers "did exploration pay for itself?": per-prompt seed groups, summed by `exploration_payoff`."""

from __future__ import annotations

import pytest

from resources.ledger.records import ExplorationRecord


def _group(iteration: int, index: int, source: str, variance: float, baseline: float, **more) -> dict:
    return {
        "iteration": iteration,
        "prompt_index": index,
        "prompt": f"p{index}",
        "planner": "explore:m8-half_steps",
        "source": source,
        "seeds": "1,2,3,4",
        "num_drawn": 4,
        "num_trained": 4,
        "trained_variance": variance,
        "drawn_variance": variance,
        "baseline_variance": baseline,
        **more,
    }


def test_the_payoff_view_compares_explored_groups_with_random_ones_per_iteration(mem_ledger) -> None:
    mem_ledger.record_exploration(ExplorationRecord(0, "m8-half_steps", budget_s=5.0, time_used_s=3.0, num_requests=3))
    mem_ledger.record_seed_groups(
        [
            _group(1, 0, "explored", 0.09, 0.04, stale_variance=0.12, stale_default_variance=0.05),
            _group(1, 1, "explored", 0.07, 0.04, stale_variance=0.10, stale_default_variance=0.03),
            _group(1, 2, "random", 0.05, 0.04),
        ]
    )
    mem_ledger.record_seed_groups([_group(2, 0, "explored", 0.02, 0.05), _group(2, 1, "random", 0.06, 0.05)])
    rows = mem_ledger.query("SELECT * FROM exploration_payoff ORDER BY iteration").as_dicts()
    first, second = rows
    assert (first["explored_prompts"], first["random_prompts"]) == (2, 1)
    assert first["explored_variance"] == pytest.approx(0.08) and first["random_variance"] == pytest.approx(0.05)
    assert first["variance_ratio"] == pytest.approx(2.0) and first["paid_off"] is True
    assert first["explored_stale_variance"] == pytest.approx(0.11) and first["random_stale_variance"] == pytest.approx(
        0.04
    )
    assert first["arm"] == "m8-half_steps" and first["explore_s"] == 3.0  # what exploring during iteration 0 took
    assert second["paid_off"] is False and second["explore_s"] is None


def test_a_redone_iteration_replaces_its_groups(mem_ledger) -> None:
    mem_ledger.record_seed_groups([_group(1, 0, "explored", 0.09, 0.04)])
    mem_ledger.record_seed_groups([_group(1, 0, "random", 0.03, 0.04)])
    assert mem_ledger.query("SELECT source, trained_variance FROM seed_groups").rows == [("random", 0.03)]


def test_a_seed_group_with_an_unknown_column_is_refused_with_the_columns_named(mem_ledger) -> None:
    with pytest.raises(ValueError, match="no columns \\['variance'\\].*trained_variance"):
        mem_ledger.record_seed_groups([{**_group(1, 0, "explored", 0.09, 0.04), "variance": 1.0}])
