"""The simulator on small runs: its ledger answers the real views, the policies differ as they should,
bad input fails early."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from resources.cluster.preemption import PreemptionEvent
from resources.ledger.db import query_ledger
from workers.sim.config import SimConfig, get_policy
from workers.sim.engine import simulate
from workers.sim.inputs import default_curve, model_preset
from workers.sim.market import Market, parse_market


def small(policy: str, **kw) -> SimConfig:
    return SimConfig(
        get_policy(policy),
        num_spot_gpus=4,
        num_trainer_gpus=2,
        gpus_per_node=2,
        iterations=3,
        prompts_per_iteration=4,
        group_size=4,
        validate_every=1,
        **kw,
    )


def test_simulated_ledger_answers_the_same_views_as_a_real_one(tmp_path):
    result = simulate(
        small("spotlight"),
        model_preset("qwen-image-20b"),
        parse_market("renewal:0.02"),
        default_curve(),
        out_dir=tmp_path,
    )
    db = tmp_path / "ledger.duckdb"
    costs = query_ledger(db, "SELECT iteration, usd_spot > 0, usd_reserved > 0 FROM cost_per_iteration ORDER BY 1").rows
    assert costs == [(k, True, True) for k in range(4)]
    assert query_ledger(db, "SELECT count(*) FROM validation_curve").rows == [(4,)]
    assert (
        query_ledger(db, "SELECT sum(preemptions) FROM preemption_summary").rows[0][0]
        == result.metrics["preemptions"]
        > 0
    )
    explored = query_ledger(db, "SELECT count(*) FROM exploration WHERE arm <> 'none'").rows[0][0]
    assert 1 <= explored <= 3  # the real bandit chose an arm whenever one fitted the predicted training time


def test_committed_state_loses_fewer_steps_than_restarting_under_the_same_kills():
    from dataclasses import replace

    times = replace(model_preset("qwen-image-20b"), startup_s=1.0, restart_delay_s=1.0, model_load_s=1.0)
    trace = tuple(PreemptionEvent(2 + 1.3 * i, f"g{i % 4}", 0.0) for i in range(400))  # kills without notice
    market = Market("test trace", trace=trace)
    lost = {p: simulate(small(p), times, market, default_curve()).metrics for p in ("naive_spot", "rlboost")}
    assert 0 < lost["rlboost"]["seconds_lost"] < lost["naive_spot"]["seconds_lost"]


def test_reserved_only_baseline_is_never_preempted_and_pays_on_demand():
    m = simulate(small("roll"), model_preset("qwen-image-20b"), parse_market(">20%"), default_curve()).metrics
    spot = simulate(small("rlboost"), model_preset("qwen-image-20b"), parse_market("none"), default_curve()).metrics
    assert m["preemptions"] == 0 and m["usd_spot"] == 0
    assert m["usd_total"] > spot["usd_total"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--market", "sometimes"], "is not one of"),
        (["--spot-gpus", "8,x"], "comma-separated integers"),
        (["--policies", "roll,magic"], "unknown ['magic']"),
        (["--model", "sdxl"], "unknown --model"),
    ],
)
def test_simulate_refuses_bad_input_with_one_line_saying_what_to_fix(args, message):
    from pipelines.cli import app

    done = CliRunner().invoke(app, ["simulate", *args])
    assert done.exit_code != 0
    assert message in " ".join(done.output.split())


def test_summary_sets_spotlight_beside_the_best_baseline_of_each_seed_with_its_spread():
    from workers.sim.summary import against_paper, summary_markdown

    def row(policy, n, seed, usd, hours, samples):
        return {
            "policy": policy,
            "spot_gpus": n,
            "seed": seed,
            "usd_total": usd,
            "wall_h": 1.0,
            "hours_to_target": hours,
            "preemptions": 0,
            "rollout_gpu_utilisation": 0.5,
            "rollout_samples_per_s": samples,
            "samples_per_hour": samples,
        }

    rows = [
        row(p, n, seed, usd * (1 + seed), hours, samples * n)
        for n in (8, 64)
        for seed in (0, 1)
        for p, usd, hours, samples in (("roll", 10, 2.0, 1.0), ("naive_spot", 6, None, 1.0), ("spotlight", 3, 1.0, 0.5))
    ]
    paper = against_paper(rows)
    assert paper["cost_ratio"][8] == {"mean": 2.0, "min": 2.0, "max": 2.0, "n": 2}  # 6 / 3: naive spot is the cheaper
    assert paper["target_ratio"][64]["mean"] == 2.0  # naive spot never reached the target: roll's 2 h against 1 h
    assert paper["scaling"]["spotlight"]["rollout_samples_per_s"]["mean"] == 8.0
    assert "not reached (0/2)" in summary_markdown(rows)


def _bench_record(path, explore_slope: float) -> None:
    """A `spotlight bench exploration --json` record, its learning part summarized from synthetic runs."""
    import json

    from workers.bench.exploration_summary import summarize_learning

    versions = [0, 5, 10, 15]
    runs = [
        {
            "strategy": s,
            "seed": seed,
            "wall_s": 60.0,
            "exploration": [],
            "curve": [{"version": v, "score": 0.3 + slope * v + 0.001 * seed} for v in versions],
            "iterations": [{"iteration": 1, "reward_std": 0.2, "zero_std_ratio": 0.0}],
        }
        for seed in range(3)
        for s, slope in (("random", 0.004), ("explore", explore_slope), ("wider_draw", 0.005))
    ]
    learning = summarize_learning(runs, 0.3, (0.04,), resamples=50)
    path.write_text(json.dumps({"target_gain": 0.04, "learning": learning}))


def test_a_bench_record_gives_the_learning_curve_and_the_measured_exploration_speedup(tmp_path):
    from pipelines.cli import app

    _bench_record(tmp_path / "bench.json", explore_slope=0.008)  # exploration reaches +0.04 in half the iterations
    args = [
        "simulate",
        "--spot-gpus",
        "4",
        "--policies",
        "spotlight",
        "--iterations",
        "4",
        "--market",
        "none",
        "--target",
        "0.33",
        "--curve",
        str(tmp_path / "bench.json"),
        "--json",
    ]
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    summary = [line for line in done.output.splitlines() if '"summary"' in line][0]
    assert "mean held-out over 3 run seeds" in summary and '"explore_speedup": 2.0' in summary
    done = CliRunner().invoke(app, args[:-1] + ["--explore-speedup", "1.0", "--json"])
    summary = [line for line in done.output.splitlines() if '"summary"' in line][0]
    assert '"explore_speedup": 1.0' in summary  # the command line wins over the record
    assert "explore speedup 1 used, from --explore-speedup" in json.loads(summary)["curve"]  # and the report says so
    (tmp_path / "not_bench.json").write_text("{}")
    done = CliRunner().invoke(app, ["simulate", "--curve", str(tmp_path / "not_bench.json")])
    assert done.exit_code != 0 and "not a `spotlight bench exploration --json` record" in " ".join(done.output.split())


def test_the_speedup_is_read_at_the_simulated_target_where_the_bench_measured_it(tmp_path):
    """Explored runs reach +0.04 in half the iterations but +0.08 only 1.33x sooner: a simulation to +0.04 takes
    2.0, one to +0.08 (the headline) 1.33, and one to a target the bench has no row for the headline's, saying so."""
    import json

    from workers.bench.exploration_summary import summarize_learning
    from workers.sim.inputs import curve_from_bench

    versions = [0, 5, 10, 15, 20]
    curves = {"random": [0.3, 0.32, 0.34, 0.36, 0.38], "explore": [0.3, 0.34, 0.36, 0.38, 0.40]}
    runs = [
        {
            "strategy": s,
            "seed": seed,
            "wall_s": 60.0,
            "exploration": [],
            "curve": [{"version": v, "score": x} for v, x in zip(versions, curve, strict=True)],
            "iterations": [{"iteration": 1, "reward_std": 0.2, "zero_std_ratio": 0.0}],
        }
        for seed in range(3)
        for s, curve in curves.items()
    ]
    path = tmp_path / "bench.json"
    learning = summarize_learning(runs, 0.3, (0.04, 0.08), resamples=50)
    path.write_text(json.dumps({"target_gain": 0.08, "learning": learning}))
    assert curve_from_bench(path, target=0.34)[1] == pytest.approx(2.0)
    assert curve_from_bench(path, target=0.38)[1] == pytest.approx(4 / 3, abs=1e-3)
    assert curve_from_bench(path)[1] == pytest.approx(4 / 3, abs=1e-3)
    curve, ratio = curve_from_bench(path, target=0.36)
    assert ratio == pytest.approx(4 / 3, abs=1e-3) and "the bench's headline (it has no +0.06 target)" in curve.source


def test_a_pre_filter_samples_w_seeds_per_explored_prompt_on_the_critical_path(tmp_path):
    """keep_factor 1.5: each prompt the plan explored is sampled with 6 seeds (W = 1.5 x G) instead of 4, so the
    pre-filter's wider rollout is charged where it runs; unexplored prompts keep G; iteration 0 explores nothing."""
    rollouts = {}
    for keep in (1.0, 1.5):
        out = tmp_path / f"keep{keep}"
        out.mkdir()
        simulate(
            small("spotlight", keep_factor=keep),
            model_preset("qwen-image-20b"),
            parse_market("none"),
            default_curve(),
            out_dir=out,
        )
        db = out / "ledger.duckdb"
        rollouts[keep] = query_ledger(
            db, "SELECT iteration, prompt, count(*) FROM requests WHERE kind = 'rollout' GROUP BY 1, 2 ORDER BY 1, 2"
        ).rows
    assert {n for _, _, n in rollouts[1.0]} == {4}
    assert [n for k, _, n in rollouts[1.5] if k == 0] == [4] * 4
    assert {n for k, _, n in rollouts[1.5] if k > 0} <= {4, 6} and any(n == 6 for _, _, n in rollouts[1.5])
    assert sum(n for *_, n in rollouts[1.5]) > sum(n for *_, n in rollouts[1.0])


def test_keep_factor_below_one_is_refused():
    with pytest.raises(ValueError, match="keep_factor must be >= 1"):
        small("spotlight", keep_factor=0.5)


def test_simulate_prints_its_recorded_calibration_or_how_to_record_one(tmp_path, monkeypatch):
    """The shipped record is read (no real run is replayed at simulate time); without one the line says how."""
    import json

    from pipelines.cli import app
    from workers.sim import calibration

    args = ["simulate", "--spot-gpus", "2", "--policies", "spotlight", "--iterations", "2", "--market", "none"]
    shipped = calibration.load_calibration()
    assert shipped is not None, "workers/sim/calibration.json is missing: spotlight simulate-calibrate writes it"
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    text = " ".join(done.output.split())
    wall = f"wall {100 * shipped['errors']['wall_s']:.1f} %"
    assert "calibration: replaying a real local run" in text and wall in text and shipped["machine"] in text
    summary = json.loads(CliRunner().invoke(app, [*args, "--json"]).output.splitlines()[-1])
    assert summary["calibration"]["errors"] == shipped["errors"]
    monkeypatch.setattr(calibration, "CALIBRATION_FILE", tmp_path / "none.json")
    text = " ".join(CliRunner().invoke(app, args).output.split())
    assert "calibration: none recorded" in text and "spotlight simulate-calibrate --ledger" in text


def test_simulate_calibrate_refuses_a_ledger_that_is_not_there(tmp_path):
    from pipelines.cli import app

    done = CliRunner().invoke(app, ["simulate-calibrate", "--ledger", str(tmp_path / "nope.duckdb")])
    assert done.exit_code != 0 and "no such file" in " ".join(done.output.split())


def test_a_batched_rollout_request_is_replayed_as_its_samples(tmp_path):
    """`make demo` samples each prompt's seeds in one queue request (`it0-p0-s0x4`), recorded as one attempt while
    the ledger's requests are its samples: the replay reads that attempt as 4 samples of the rollout's steps (before,
    it matched no request, and the replay fell back to a made-up 0.01 s step), and the pre-filter's 6 seeds of
    prompt 1 as a keep factor of 1.5."""
    from datetime import datetime, timedelta

    from resources.keys import batch_request_id, request_id
    from resources.ledger import Ledger
    from resources.ledger.records import AttemptRecord, RequestRecord
    from workers.sim.measure import attempt_rows, replay_inputs

    t0 = datetime(2026, 12, 7, 12, 0, 0)
    at = lambda s: t0 + timedelta(seconds=s)  # noqa: E731
    ledger = Ledger(tmp_path / "ledger.duckdb")
    ledger.start_run("demo", preset="cpu_tiny_spot")
    ledger.start_worker("w0.0", role="rollout", instance_type="local", spot=True, usd_per_hour=0.1, at=at(0))
    ledger.start_worker("t0", role="trainer", instance_type="local", spot=False, usd_per_hour=0.2, at=at(0))
    ledger.start_iteration(0, weights_version=0, at=at(1))
    for phase, start, end in (("sync", 1, 2), ("rollout", 2, 12), ("train", 12, 15)):
        ledger.record_phase(0, phase, at(start), at(end))
    seeds = {0: 4, 1: 6}
    ledger.record_requests(
        RequestRecord(request_id(0, p, s), 0, "rollout", f"prompt {p}", s, 0, "w0.0", 1, finished_at=at(11))
        for p, n in seeds.items()
        for s in range(n)
    )
    for p, n, start, end in ((0, 4, 2.5, 5.7), (1, 6, 5.8, 10.6)):
        queue_id = batch_request_id(request_id(0, p, 0), n)  # as the rollout phase names it (queue_batches)
        ledger.record_attempt(AttemptRecord(queue_id, 1, "w0.0", at(start), at(end), "done", steps_done=8))
    ledger.end_iteration(0, at=at(15))
    ledger.start_iteration(1, weights_version=1, at=at(15))  # the final iteration: sync only
    ledger.record_phase(1, "sync", at(15), at(16))
    ledger.end_iteration(1, at=at(16))
    ledger.close()

    rows = attempt_rows(tmp_path / "ledger.duckdb")
    assert [(r["kind"], r["iteration"], r["samples"]) for r in rows] == [("rollout", 0, 4), ("rollout", 0, 6)]
    replay = replay_inputs(tmp_path / "ledger.duckdb")
    assert replay.times.num_steps == 8
    assert replay.times.step_s == pytest.approx((3.2 + 4.8) / (8 * 10))  # seconds per sample-step: 0.1
    assert replay.setup.iterations[0].claim_s == pytest.approx(0.1 / 6)  # the hand-over, per sample
    assert replay.config.group_size == 4 and replay.config.keep_factor == 1.5


def test_the_time_to_a_target_falls_between_validations_so_a_larger_speedup_reads_sooner(tmp_path):
    """Read only at the validations (every 5 iterations here), a 1.2x and a 1.4x faster learner both 'reach' the
    target at the same validation, and a 2.8x one at the same as 1.5x (the MiniOCR re-run's first table): the time
    to a target is where the run's validation curve crosses it, linear between readings, as the bench reads its
    curves."""
    from dataclasses import replace

    from workers.sim.inputs import LearningCurve

    curve = LearningCurve((0.0, 20.0), (0.0, 1.0), "linear, test")
    reached = {}
    for speedup in (1.2, 1.4):
        out = tmp_path / str(speedup)
        out.mkdir()
        config = replace(small("spotlight", explore_speedup=speedup), iterations=10, validate_every=5)
        result = simulate(config, model_preset("qwen-image-20b"), parse_market("none"), curve, out_dir=out, target=0.3)
        readings = query_ledger(out / "ledger.duckdb", "SELECT elapsed_s, score FROM validation_curve ORDER BY 1").rows
        first = next(i for i, (_, score) in enumerate(readings) if score >= 0.3)
        hours = result.metrics["hours_to_target"]
        assert readings[first - 1][0] / 3600 < hours < readings[first][0] / 3600  # between two validations
        assert 0 < result.metrics["usd_to_target"]
        reached[speedup] = result.metrics
    assert reached[1.4]["hours_to_target"] < reached[1.2]["hours_to_target"]
    assert reached[1.4]["usd_to_target"] < reached[1.2]["usd_to_target"]
