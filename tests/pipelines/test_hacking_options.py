"""`--on-hacking` and its companions on `spotlight train` and `spotlight run`: bad values are refused before any
compute, naming the option; a resumed run may change what a flag does, and keeps the rest."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner


def _invoke(command: str, *args: str):
    from pipelines.cli import app

    return CliRunner().invoke(app, [command, *args])


def _said(result, message: str) -> bool:
    return result.exit_code != 0 and " ".join(message.split()) in " ".join(result.output.replace("│", " ").split())


@pytest.mark.parametrize("command", ["train", "run"])
@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--on-hacking", "ignore", "'ignore' is not one of 'warn', 'stop', 'rollback'"),
        ("--hacking-window", "0", "window"),
        (
            "--rollback-lr-scale",
            "2",
            "--rollback-lr-scale: guard.rollback_lr_scale: Input should be less than or equal to 1",
        ),
    ],
)
def test_a_bad_guard_flag_is_refused_before_any_compute(tmp_path, command, flag, value, message):
    where = ["--out", str(tmp_path / "r")] if command == "train" else ["--run-dir", str(tmp_path / "r")]
    result = _invoke(command, "--preset", "cpu_smoke", *where, flag, value)
    assert _said(result, message), result.output
    assert not (tmp_path / "r" / "ledger.duckdb").exists()


def test_a_resumed_run_may_change_on_hacking_and_keeps_the_other_guard_settings(tmp_path):
    from pipelines.deploy import build_resources
    from pipelines.run import resolve_run, save_run_config

    save_run_config(
        resolve_run(
            tmp_path, resume=False, flags={"preset": "cpu_smoke", "on_hacking": "stop", "hacking_z": 3.0}
        ).config
    )
    config = resolve_run(tmp_path, resume=True, flags={"on_hacking": "rollback", "hacking_z": None}).config
    guard = build_resources(config)["run_config"].settings.hacking
    assert (guard.on_hacking, guard.rule.z) == ("rollback", 3.0)
    with pytest.raises(ValueError, match="guard.hacking_z 2.0 "):
        resolve_run(tmp_path, resume=True, flags={"hacking_z": 2.0})


@pytest.mark.slow
def test_train_stops_after_a_flagged_iteration_with_exit_code_3_and_an_interrupted_run(tmp_path):
    from resources.ledger import Ledger

    out = tmp_path / "run"
    # bounds of 1e-9: the first update of the shipped base changes the held-out images' compressed size
    result = _invoke(
        "train",
        "--preset",
        "cpu_smoke",
        "--seed",
        "0",
        "--out",
        str(out),
        "--json",
        "--on-hacking",
        "stop",
        "--hacking-max-drop",
        "1e-9",
        "--hacking-max-rise",
        "1e-9",
    )
    assert result.exit_code == 3, result.output
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["iteration"], r["hacking_action"]) for r in records] == [(0, None), (1, "stop")]
    ledger = Ledger(out / "ledger.duckdb")
    assert ledger.query("SELECT status FROM runs").rows == [("interrupted",)]
    assert ledger.query("SELECT iteration, flagged, rule LIKE 'drift:%' FROM reward_hacking ORDER BY 1").rows == [
        (0, False, None),
        (1, True, True),
    ]
