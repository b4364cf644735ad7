"""`spotlight bench chaos --quick`: the soak's smoke run loses nothing,
duplicates nothing and matches the fault-free hashes."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipelines.bench_cli import bench_app
from workers.bench.chaos import ChaosBench


# 60-90 s on 2 shared cores: two worker start-ups, a third after a preemption, and the fault-free reference
@pytest.mark.nightly
@pytest.mark.slow
def test_the_quick_chaos_soak_reports_preemptions_and_no_lost_duplicated_or_mismatched_result() -> None:
    result = CliRunner().invoke(bench_app, ["chaos", "--quick", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["completed"] and figures["iterations_done"] == 2
    assert figures["preemptions"] >= 1 and figures["preemptions_per_worker_hour"] > 0
    assert (figures["lost"], figures["duplicated"], figures["hash_mismatches"]) == (0, 0, 0)
    assert figures["hash_checked"] == figures["requests"] == 8


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"num_iterations": 0}, "num_iterations must be >= 1"),
        ({"notice_share": 1.5}, r"notice_share must lie in \[0, 1\]"),
        ({"queue": "kafka"}, "queue must be sqlite or redis"),
        ({"redis_restart_every_s": 5.0}, "redis_restart_every_s needs queue=redis"),
    ],
)
def test_a_chaos_bench_with_a_bad_setting_is_refused_naming_it(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ChaosBench(**changes)
