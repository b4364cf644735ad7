"""`spotlight run`'s default preset, cpu_tiny_spot (`make demo`), for one iteration: local spot workers sample whole
groups per request, explore the next iteration's seeds while the trainer trains, and the ledger and the report
record it all."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from pipelines.cli import app
from resources.ledger.db import query_ledger
from resources.settings.resolve import derive
from workers.trainer import presets


def _run_demo(run_dir, prompts):
    """`spotlight run` with the default preset, rollouts and worker count: what `make demo` runs, without
    injected preemptions and for one iteration."""
    threads = torch.get_num_threads()
    try:
        return CliRunner().invoke(
            app,
            ["run", "--run-dir", str(run_dir), "--iterations", "1", "--preemptions-per-hour", "0"]
            + ["--validation-prompts", str(prompts)],
            env={"COLUMNS": "300"},
        )
    finally:
        torch.set_num_threads(threads)


@pytest.mark.slow
def test_the_demo_preset_runs_an_iteration_on_local_spot_workers_and_records_it(tmp_path, monkeypatch):
    # The demo's recipe unchanged but for 2 prompts per iteration instead of 8 (and --iterations 1): the same
    # code path (whole-group requests, exploration beside training, NFT update, validation, report) in a
    # fraction of the time.
    demo = presets.cpu_tiny_spot()
    two_prompts = derive(demo, "cpu_tiny_spot", train={"prompts_per_iteration": 2})
    monkeypatch.setitem(presets.PRESETS, "cpu_tiny_spot", lambda: two_prompts)
    prompts = tmp_path / "heldout.txt"
    prompts.write_text("three red circles\ntwo purple squares\n")
    run_dir = tmp_path / "demo"
    done = _run_demo(run_dir, prompts)
    assert done.exit_code == 0, done.output
    assert "rollouts on 2 local spot workers" in done.output
    assert "it   0  reward" in done.output and "it   1  held-out" in done.output

    def rows(sql: str) -> list[tuple]:
        return query_ledger(run_dir / "ledger.duckdb", sql).rows

    assert rows("SELECT preset, status FROM runs") == [("cpu_tiny_spot", "succeeded")]
    phases = rows("SELECT iteration, list(phase ORDER BY phase) FROM phases GROUP BY 1 ORDER BY 1")
    assert phases == [(0, ["explore", "rollout", "sync", "train", "validate"]), (1, ["sync", "validate"])]
    # Each prompt's whole group of 8 seeds, sampled by the spot workers, each request once (nothing preempted).
    group = demo.train.group_size
    assert rows(
        "SELECT count(*), count(DISTINCT prompt), max(attempts), bool_and(status = 'done') FROM requests "
        "WHERE kind = 'rollout'"
    ) == [(2 * group, 2, 1, True)]
    assert rows(
        "SELECT DISTINCT w.role, w.spot FROM requests r JOIN workers w USING (worker_id) WHERE r.kind = 'rollout'"
    ) == [("rollout", True)]
    assert [len(seeds.split(",")) for (seeds,) in rows("SELECT seeds FROM seed_groups WHERE iteration = 0")] == [
        group
    ] * 2
    # Exploration beside training planned the next iteration: the arm the bandit chose and the requests it sent.
    ((arm, explored),) = rows("SELECT arm, num_requests FROM exploration WHERE iteration = 0")
    assert explored == rows("SELECT count(*) FROM requests WHERE kind = 'explore' AND iteration = 0")[0][0]
    assert arm == "none" or explored > 0
    assert rows("SELECT iteration, count(*) FROM train_steps GROUP BY 1") == [(0, 1)]
    assert rows("SELECT weights_version, num_prompts FROM validation ORDER BY 1") == [(0, 2), (1, 2)]
    # Workers are paid while alive and all ended with the run; spot and reserved money both show.
    assert rows("SELECT count(*) FROM workers WHERE ended_at IS NULL OR end_reason <> 'finished'") == [(0,)]
    ((spot, reserved),) = rows("SELECT usd_spot, usd_reserved FROM run_cost")
    assert spot > 0 and reserved > 0
    # The report: its page, the before/after of the validated weights and the plots it links.
    report = run_dir / "report"
    html = (report / "index.html").read_text()
    assert "<title>spotlight run demo</title>" in html and "Before / after" in html
    for plot in ("validation.png", "cost.png", "exploration.png", "sync.png"):
        assert (report / plot).stat().st_size > 0 and plot in html, plot
