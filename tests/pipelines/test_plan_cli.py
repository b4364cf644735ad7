"""`spotlight plan`: the cheapest simulated configuration that reaches the target within the budget and deadline."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipelines.cli import app

TARGET = 0.35


@pytest.fixture
def curve(tmp_path):
    """A learning curve that crosses TARGET between iterations 2 and 4 (the shape of a bench exploration record)."""
    record = {
        "target_gain": 0.04,
        "learning": {
            "versions": [0, 2, 4, 6],
            "seeds": [0],
            "strategies": {"random": {"mean_curve": [0.30, 0.34, 0.38, 0.42]}},
            "targets": {"+0.04": {}},
        },
    }
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(record))
    return path


def _args(curve, *extra: str) -> list[str]:
    """Two candidates: few spot GPUs (slower, cheaper) and many (faster, dearer)."""
    return [
        "--spot-gpus",
        "4,64",
        "--policies",
        "naive_spot",
        "--iterations",
        "4",
        "--market",
        "none",
        "--target",
        str(TARGET),
        "--curve",
        str(curve),
        *extra,
    ]


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})


def test_plan_picks_the_cheapest_run_that_meets_the_deadline_among_the_simulated_ones(curve):
    done = _invoke("simulate", *_args(curve, "--json"))
    assert done.exit_code == 0, done.output
    few, many = [json.loads(line) for line in done.output.splitlines() if '"policy"' in line]
    assert (few["spot_gpus"], many["spot_gpus"]) == (4, 64)
    # What makes the choice depend on the deadline: more GPUs reach the target sooner, at a higher cost.
    assert many["hours_to_target"] < few["hours_to_target"] and many["usd_to_target"] > few["usd_to_target"]

    plan = _invoke("plan", "--budget", "1e6", "--deadline-h", "1e4", *_args(curve, "--json"))
    assert plan.exit_code == 0, plan.output
    record = json.loads(plan.output)
    assert record["feasible"] and record["candidates"] == 2 and record["target"] == TARGET
    assert record["best"]["spot_gpus"] == 4
    assert record["best"]["usd_to_target"] == pytest.approx(few["usd_to_target"])
    assert record["best"]["hours_to_target"] == pytest.approx(few["hours_to_target"])

    # A deadline the cheap run misses: the faster, dearer one, in one line with its hours and dollars.
    deadline = (many["hours_to_target"] + few["hours_to_target"]) / 2
    text = _invoke("plan", "--budget", "1e6", "--deadline-h", f"{deadline:.4f}", *_args(curve))
    assert text.exit_code == 0, text.output
    assert (
        f"cheapest: naive_spot on 64 spot GPUs: target {TARGET} in {many['hours_to_target']:.2f} h for "
        f"${many['usd_to_target']:.1f}"
    ) in text.output


def test_plan_says_when_nothing_fits_the_budget_and_exits_non_zero(curve):
    done = _invoke("plan", "--budget", "0.01", "--deadline-h", "1e4", *_args(curve))
    assert done.exit_code == 1
    assert f"no configuration of 2 reaches {TARGET} within 10000.0 h and $0.01; raise the budget" in done.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--budget", "0", "--deadline-h", "5"], "--budget and --deadline-h must be > 0"),
        (["--budget", "100", "--deadline-h", "-1"], "--budget and --deadline-h must be > 0"),
        (["--budget", "100", "--deadline-h", "5", "--spot-gpus", "8,x"], "comma-separated integers"),
        (["--budget", "100", "--deadline-h", "5", "--policies", "roll,magic"], "unknown ['magic']"),
        (["--budget", "100", "--deadline-h", "5", "--market", "sometimes"], "is not one of"),
        (["--deadline-h", "5"], "Missing option '--budget'"),
    ],
)
def test_plan_refuses_bad_input_before_simulating_with_a_line_saying_what_to_fix(args, message):
    done = _invoke("plan", *args)
    assert done.exit_code == 2
    assert message in " ".join(done.output.split())
