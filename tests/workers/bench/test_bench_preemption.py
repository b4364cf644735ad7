"""`spotlight bench preemption`: the figures it prints come from real interrupted and resumed requests."""

from __future__ import annotations

import pytest

from workers.bench.preemption import format_preemption_report, run_preemption_bench


def test_state_commitment_cuts_the_work_a_preemption_loses_and_resumes_bit_identically() -> None:
    figures = run_preemption_bench(quick=True, with_throughput=False)
    rows = {r["strategy"]: r for r in figures["lost_work"]}
    none = rows["no state commitment (killed, or noticed)"]
    every_2 = rows["commit every 2 steps, killed (no notice)"]
    noticed = next(r for r in figures["lost_work"] if r["notice"])
    n = figures["num_steps"]
    assert none["steps_lost_mean"] == sum(range(1, n)) / (n - 1)  # a kill after step k loses all k steps
    assert 1 <= every_2["steps_lost_mean"] < none["steps_lost_mean"] and every_2["steps_lost_max"] == 2
    assert noticed["steps_lost_max"] == 0
    assert all(r["resumed_results_bit_identical"] for r in figures["lost_work"])
    overhead = figures["commit_overhead"]["per_cadence"]
    assert overhead[0]["overhead_s_per_step"] > overhead[-1]["overhead_s_per_step"] > 0
    assert "pull" not in format_preemption_report(figures)


@pytest.mark.nightly
@pytest.mark.slow
def test_pulling_beats_static_assignment_when_one_worker_is_slow() -> None:
    # The slow worker sleeps 0.1 s a step (1.6 s over its 4 static requests): a gap that CPU contention from other
    # tests and the workers' 0.2 s queue polls cannot close (3x a tiny policy's step time could: 0.89 s vs 0.83 s).
    figures = run_preemption_bench(quick=True, with_throughput=True, slow_step_delay_s=0.1)
    tp = figures["throughput"]
    assert tp["pull"]["completed"] and tp["static"]["completed"]
    assert tp["pull"]["wall_s"] < tp["static"]["wall_s"]
    assert "faster than static assignment" in format_preemption_report(figures)
