"""The run ledger: views against hand-computed numbers, record checks, prices, credentials, docs, the CLI.

The DuckDB file itself (migration, concurrent reading, the Dagster wrapper): tests/resources/test_ledger_db.py.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from resources.ledger import Ledger
from resources.ledger.records import (
    AttemptRecord,
    ExplorationRecord,
    PreemptionRecord,
    RequestRecord,
    SyncRecord,
    TrainStepRecord,
    components_json,
)
from resources.prices import load_prices
from tests.paths import REPO_ROOT

REPO = REPO_ROOT
T0 = datetime(2026, 1, 1)


def at(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def fill_two_iterations(ledger: Ledger) -> None:
    """A small run whose costs are easy to compute by hand (see the view tests).

    trainer  reserved $4/h  0:00-2:00
    spot-a   spot     $1/h  0:00-2:00
    spot-b   spot     $1/h  0:00-0:30  preempted with 120 s notice, 2 steps lost, state committed
    spot-c   spot     $1/h  0:40-1:30  preempted without notice, 5 steps lost
    iteration 0: 0:00-1:00, iteration 1: 1:00-2:00
    """
    ledger.start_run("demo", preset="cpu_tiny", config={"lr": 1e-4}, store_url="file:///tmp/store", at=at(0))
    _start_workers(ledger)
    for iteration in (0, 1):
        _record_iteration(ledger, iteration)
    _record_preemptions(ledger)
    ledger.record_requests(_requests())
    ledger.record_attempt(AttemptRecord("r-1", 1, "spot-b", at(10), at(30), "preempted", steps_done=2))
    ledger.record_attempt(AttemptRecord("r-1", 2, "spot-a", at(31), at(32), "done", resumed_from_step=2, steps_done=6))
    for worker in ("trainer", "spot-a"):
        ledger.end_worker(worker, reason="finished", at=at(120))
    ledger.end_run("demo", at=at(120))


def _start_workers(ledger: Ledger) -> None:
    """The reserved trainer at $4/h and three spot rollout workers at $1/h (spot-c starts at 0:40)."""
    ledger.start_worker(
        "trainer", role="trainer", instance_type="local-reserved", spot=False, usd_per_hour=4.0, at=at(0)
    )
    for worker, start in (("spot-a", 0), ("spot-b", 0), ("spot-c", 40)):
        ledger.start_worker(
            worker, role="rollout", instance_type="g6.xlarge", gpu_type="L4", spot=True, usd_per_hour=1.0, at=at(start)
        )


PHASE_MINUTES = {"sync": (0, 6), "rollout": (6, 30), "train": (30, 54), "explore": (30, 50), "validate": (55, 60)}
"""Each phase's window within its iteration's hour (explore overruns train in iteration 1: 30-56)."""


def _record_iteration(ledger: Ledger, iteration: int) -> None:
    """One hour-long iteration: its phases, a sync (anchor, then a 40-byte patch), exploration, two train steps
    and a validation (0.40, then 0.55)."""
    base = 60 * iteration
    ledger.start_iteration(iteration, weights_version=iteration, at=at(base))
    for phase, (start, end) in PHASE_MINUTES.items():
        end = 56 if (iteration, phase) == (1, "explore") else end
        ledger.record_phase(iteration, phase, at(base + start), at(base + end))
    ledger.end_iteration(iteration, at=at(base + 60))
    first = iteration == 0
    ledger.record_sync(
        SyncRecord(
            iteration,
            "anchor" if first else "patch",
            1000,
            1000 if first else 40,
            iteration=iteration,
            changed_fraction=None if first else 0.01,
            encode_s=0.5,
            apply_s=0.1,
        )
    )
    ledger.record_exploration(
        ExplorationRecord(
            iteration,
            "taylorseer-3",
            budget_s=1440,
            time_used_s=1200 + 360 * iteration,
            num_requests=16,
            reward_variance=0.02,
            rank_consistency=0.8,
        )
    )
    ledger.record_train_steps(
        [
            TrainStepRecord(
                iteration, s, loss=0.1, kl=0.01, reward_mean=0.4 + 0.1 * iteration, reward_std=0.2, zero_std_ratio=0.25
            )
            for s in range(2)
        ]
    )
    ledger.record_validation(
        iteration,
        weights_version=iteration + 1,
        score=(0.40, 0.55)[iteration],
        num_prompts=8,
        criteria={"counting": (0.2, 0.4)[iteration], "color": (0.6, 0.7)[iteration]},
        at=at(base + 60),
        reward="minigeneval_strict",
    )


def _record_preemptions(ledger: Ledger) -> None:
    """spot-b preempted at 0:30 with 120 s notice (state committed), spot-c at 1:30 without notice."""
    ledger.end_worker("spot-b", reason="preempted", at=at(30))
    ledger.record_preemption(
        PreemptionRecord("spot-b", at(30), notice_s=120, steps_lost=2, state_committed=True, request_id="r-1")
    )
    ledger.end_worker("spot-c", reason="preempted", at=at(90))
    ledger.record_preemption(
        PreemptionRecord("spot-c", at(90), notice_s=0, steps_lost=5, state_committed=False, request_id="r-9")
    )


def _requests() -> list[RequestRecord]:
    """16 rollout requests on spot-a, 8 per iteration, r-1 and r-9 on a second attempt, each with two components."""
    return [
        RequestRecord(
            f"r-{i}",
            i // 8,
            "rollout",
            f"prompt {i % 4}",
            seed=i,
            weights_version=i // 8,
            worker_id="spot-a",
            attempts=2 if i in (1, 9) else 1,
            result_hash=f"h{i}",
            reward=0.5,
            enqueued_at=at(6 + 60 * (i // 8)),
            finished_at=at(20 + 60 * (i // 8)),
            reward_components=components_json({"pickscore": 20.0 + i / 16, "minigeneval": 0.5}),
        )
        for i in range(16)
    ]


@pytest.fixture
def filled(mem_ledger: Ledger) -> Ledger:
    fill_two_iterations(mem_ledger)
    return mem_ledger


def rows(ledger: Ledger, sql: str) -> list[dict]:
    return ledger.query(sql).as_dicts()


# --- views give the hand-computed numbers --------------------------------------------------


def test_cost_per_iteration_matches_a_hand_computation(filled: Ledger) -> None:
    it0, it1 = rows(filled, "SELECT * FROM cost_per_iteration")
    # it 0: trainer 1 h x $4; spot-a 1 h, spot-b 0.5 h, spot-c 20 min, all at $1.
    assert it0["usd_reserved"] == pytest.approx(4.0)
    assert it0["usd_spot"] == pytest.approx(1 + 0.5 + 1 / 3)
    assert it0["usd_total"] == pytest.approx(4 + 1.5 + 1 / 3)
    assert it0["spot_share"] == pytest.approx((1.5 + 1 / 3) / (5.5 + 1 / 3))
    # rollout 0:06-0:30 (0.4 h): trainer $1.60, spot-a and spot-b $0.40 each.
    assert it0["usd_rollout"] == pytest.approx(1.6 + 0.8)
    assert it0["wall_s"] == 3600 and it0["critical_path_s"] == pytest.approx(3540)  # 1-min gap before validate
    # it 1: trainer $4, spot-a $1, spot-c 30 min.
    assert (it1["usd_reserved"], it1["usd_spot"]) == (pytest.approx(4.0), pytest.approx(1.5))


def test_cost_per_phase_splits_spot_and_reserved(filled: Ledger) -> None:
    sync0 = rows(filled, "SELECT * FROM cost_per_phase WHERE iteration = 0 AND phase = 'sync'")[0]
    assert sync0["wall_s"] == 360
    assert sync0["usd_reserved"] == pytest.approx(4 * 0.1)
    assert sync0["usd_spot"] == pytest.approx(2 * 0.1)
    assert [r["phase"] for r in rows(filled, "SELECT phase FROM cost_per_phase WHERE iteration = 1")] == [
        "sync",
        "rollout",
        "train",
        "explore",
        "validate",
    ]


def test_run_cost_counts_every_worker_lifetime(filled: Ledger) -> None:
    run = rows(filled, "SELECT * FROM run_cost")[0]
    assert run["usd_reserved"] == pytest.approx(8.0)
    assert run["usd_spot"] == pytest.approx(2 + 0.5 + 50 / 60)
    assert run["spot_hours"] == pytest.approx(2 + 0.5 + 50 / 60)
    assert run["usd_outside_iterations"] == pytest.approx(0.0)


def test_preemption_summary_matches_a_hand_computation(filled: Ledger) -> None:
    (summary,) = rows(filled, "SELECT * FROM preemption_summary")
    assert summary["instance_type"] == "g6.xlarge" and summary["spot_workers"] == 3
    assert summary["preemptions"] == 2 and summary["with_notice"] == 1 and summary["without_notice"] == 1
    assert summary["preemptions_per_hour"] == pytest.approx(2 / (2 + 0.5 + 50 / 60))
    assert summary["steps_lost"] == 7 and summary["steps_lost_per_preemption"] == pytest.approx(3.5)
    assert summary["state_committed"] == 1


def test_validation_curve_tracks_best_score_elapsed_time_and_spend(filled: Ledger) -> None:
    first, second = rows(filled, "SELECT * FROM validation_curve")
    assert (first["score"], first["delta"], first["elapsed_s"]) == (0.40, None, 3600)
    assert second["best_score"] == 0.55 and second["delta"] == pytest.approx(0.15)
    assert second["cumulative_usd"] == pytest.approx(4 + 1.5 + 1 / 3 + 5.5)
    scores = rows(filled, "SELECT criterion, score FROM validation_scores WHERE iteration = 1 ORDER BY criterion")
    assert scores == [{"criterion": "color", "score": 0.7}, {"criterion": "counting", "score": 0.4}]


def test_validation_rows_say_which_reward_scored_them(filled: Ledger) -> None:
    assert {r["reward"] for r in rows(filled, "SELECT reward FROM validation_curve")} == {"minigeneval_strict"}


def test_reward_components_are_averaged_per_iteration_and_request_kind(filled: Ledger) -> None:
    means = rows(
        filled,
        "SELECT iteration, component, mean, num_requests FROM reward_components "
        "WHERE kind = 'rollout' ORDER BY iteration, component",
    )
    assert [(r["iteration"], r["component"], r["num_requests"]) for r in means] == [
        (0, "minigeneval", 8),
        (0, "pickscore", 8),
        (1, "minigeneval", 8),
        (1, "pickscore", 8),
    ]
    assert means[1]["mean"] == pytest.approx(20 + sum(range(8)) / 8 / 16)
    assert means[3]["mean"] == pytest.approx(20 + sum(range(8, 16)) / 8 / 16)
    with pytest.raises(ValueError, match="not finite"):
        RequestRecord("r-x", 0, "rollout", "p", 1, 0, None, 1, reward_components='{"pickscore": NaN}')


def test_rerecording_rows_replaces_them_instead_of_duplicating(filled: Ledger) -> None:
    fill_two_iterations(filled)  # a resumed run records the same facts again
    counts = rows(
        filled,
        "SELECT (SELECT count(*) FROM requests) AS r, (SELECT count(*) FROM iterations) AS i, "
        "(SELECT count(*) FROM validation_scores) AS v, (SELECT count(*) FROM runs) AS runs",
    )[0]
    assert counts == {"r": 16, "i": 2, "v": 4, "runs": 1}


def test_each_replica_of_a_trainer_round_keeps_its_own_sync_row(mem_ledger: Ledger) -> None:
    for replica, sent in ((0, 300), (1, 280)):
        mem_ledger.record_sync(SyncRecord(4, "pulseloco", 10_000, sent, iteration=4, replica=replica))
    mem_ledger.record_sync(SyncRecord(4, "pulseloco", 10_000, 290, iteration=4, replica=1))  # a re-record replaces
    assert rows(mem_ledger, "SELECT replica, patch_bytes FROM syncs ORDER BY replica") == [
        {"replica": 0, "patch_bytes": 300},
        {"replica": 1, "patch_bytes": 290},
    ]


def test_worker_priced_from_the_table_records_price_and_source(mem_ledger: Ledger) -> None:
    usd = mem_ledger.start_worker(
        "w", role="rollout", instance_type="a3-highgpu-8g", gpu_type="h100", num_gpus=8, spot=True, at=at(0)
    )
    row = rows(mem_ledger, "SELECT usd_per_hour, price_source FROM workers")[0]
    assert usd == pytest.approx(8 * load_prices().price("H100").spot_usd_per_gpu_hour)
    assert row["usd_per_hour"] == pytest.approx(usd) and "approximate" in row["price_source"]


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda led: led.record_phase(0, "warmup", at(0)), "phase must be one of"),
        (lambda led: led.start_worker("w", role="rollout", instance_type="x", spot=True), "give gpu_type"),
        (
            lambda led: led.start_worker("w", role="rollout", instance_type="x", gpu_type="TPU-v9", spot=True),
            "no price for GPU type",
        ),
        (lambda led: led.end_worker("ghost", reason="finished"), "never started"),
        (lambda led: led.record_request(RequestRecord("r", 0, "train", "p", 1, 0, None, 1)), "kind must be one of"),
    ],
)
def test_bad_records_raise_actionable_value_errors(mem_ledger: Ledger, call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call(mem_ledger)


# --- prices -----------------------------------------------------------------------------


def test_user_price_yaml_overrides_and_extends_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(
        "gpus:\n  H100: {spot_usd_per_gpu_hour: 1.25}\n"
        "  MI300X: {on_demand_usd_per_gpu_hour: 3.0, spot_usd_per_gpu_hour: 1.5}\n"
    )
    table = load_prices(path)
    assert table.price("H100").spot_usd_per_gpu_hour == 1.25
    assert table.price("H100").on_demand_usd_per_gpu_hour == load_prices().price("H100").on_demand_usd_per_gpu_hour
    assert table.usd_per_hour("MI300X", spot=False, num_gpus=2)[0] == 6.0


def test_bad_price_yaml_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("gpus:\n  NEWGPU: {spot_usd_per_gpu_hour: 1.0}\n")
    with pytest.raises(ValueError, match="needs on_demand_usd_per_gpu_hour"):
        load_prices(path)


def test_every_default_price_names_a_source_and_date() -> None:
    for name, price in load_prices().gpus.items():
        assert price.source and re.match(r"\d{4}-\d{2}-\d{2}", price.as_of), name
        assert 0 < price.spot_usd_per_gpu_hour < price.on_demand_usd_per_gpu_hour, name


# --- credentials ------------------------------------------------------------------------


def test_no_credentials_are_ever_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAIOSFODNN7EXAMPLE")
    path = tmp_path / "ledger.duckdb"
    ledger = Ledger(path)
    fill_two_iterations(ledger)
    ledger.start_run(
        "demo",
        store_url="s3://bucket/prefix",
        queue_url="redis://127.0.0.1:6379/0",
        config={"store": "s3://bucket/prefix"},
    )
    with pytest.raises(ValueError, match="credential"):
        ledger.start_run("demo", config={"redis": {"password": "hunter2"}})
    with pytest.raises(ValueError, match="must not carry credentials"):
        ledger.start_run("demo", queue_url="redis://:hunter2@host:6379")
    dump = json.dumps(
        [ledger.query(f"SELECT * FROM {t}").rows for (t,) in ledger.query("SHOW TABLES").rows], default=str
    )
    raw = path.read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("ledger.duckdb*") if p != path)
    for value in (secret, "AKIAIOSFODNN7EXAMPLE", "hunter2"):
        assert value not in dump and value.encode() not in raw


# --- docs/LEDGER.md ---------------------------------------------------------------------


def test_every_query_in_the_ledger_docs_runs_as_written(filled: Ledger) -> None:
    text = (REPO / "docs" / "LEDGER.md").read_text()
    queries = re.findall(r"```sql\n(.*?)```", text, flags=re.DOTALL)
    assert len(queries) >= 4
    for sql in queries:
        result = filled.query(sql)
        assert result.rows, f"query returned no rows on the example ledger:\n{sql}"


def test_cli_ledger_command_prints_json_and_csv(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipelines.cli import app

    path = tmp_path / "ledger.duckdb"
    fill_two_iterations(Ledger(path))
    sql = "SELECT iteration, round(usd_total, 4) AS usd FROM cost_per_iteration ORDER BY iteration"
    as_json = CliRunner().invoke(app, ["ledger", sql, "--db", str(path), "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert [json.loads(line) for line in as_json.output.splitlines()] == [
        {"iteration": 0, "usd": 5.8333},
        {"iteration": 1, "usd": 5.5},
    ]
    as_csv = CliRunner().invoke(app, ["ledger", sql, "--db", str(path), "--csv"])
    assert as_csv.output.splitlines() == ["iteration,usd", "0,5.8333", "1,5.5"]
    table = CliRunner().invoke(app, ["ledger", sql, "--db", str(path)])
    assert table.exit_code == 0 and "5.8333" in table.output
    bad = CliRunner().invoke(app, ["ledger", "SELECT nope FROM runs", "--db", str(path)])
    assert bad.exit_code != 0 and "nope" in bad.output
