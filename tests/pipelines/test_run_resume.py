"""`spotlight run --resume` as the reserved node uses it (resume-or-start), and the --max-usd spend cap."""

from __future__ import annotations

import time

import pytest
import yaml
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.run import BudgetReachedError, check_budget, resolve_run, save_run_config
from resources.settings.resolve import CONFIG_NAME


def test_resume_on_a_fresh_folder_starts_the_run_and_later_continues_it(tmp_path) -> None:
    config = resolve_run(tmp_path / "cloud", resume=True, flags={"preset": "cpu_smoke", "iterations": 2}).config
    assert (config.preset, config.train.iterations) == ("cpu_smoke", 2)
    save_run_config(config)
    again = resolve_run(tmp_path / "cloud", resume=True, flags={"preset": "cpu_smoke"}).config  # the node restarted
    assert again == config
    with pytest.raises(ValueError, match=r"train.iterations 5 \(--iterations; the run has 2\)"):
        resolve_run(tmp_path / "cloud", resume=True, flags={"iterations": 5})


def test_resume_refuses_a_folder_with_a_ledger_but_no_run_config(tmp_path) -> None:
    (tmp_path / "ledger.duckdb").write_bytes(b"")
    with pytest.raises(ValueError, match=f"holds a ledger but no {CONFIG_NAME}"):
        resolve_run(tmp_path, resume=True, flags={})


def test_the_spend_cap_stops_the_run_once_the_ledger_spent_it(mem_ledger) -> None:
    mem_ledger.start_worker(
        "vm-1", role="rollout", instance_type="x", spot=True, usd_per_hour=3600.0, at=time.time() - 2
    )  # about $2 so far
    check_budget(mem_ledger, None, 0)
    check_budget(mem_ledger, 50.0, 0)
    with pytest.raises(BudgetReachedError, match=r"spent \$2\.\d+, reaching --max-usd 1, after iteration 3"):
        check_budget(mem_ledger, 1.0, 3)


def test_run_refuses_a_non_positive_max_usd_before_any_compute(tmp_path) -> None:
    result = CliRunner().invoke(
        app, ["run", "--run-dir", str(tmp_path / "r"), "--max-usd", "0"], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2 and "--max-usd must be a positive" in result.output
    assert not (tmp_path / "r").exists()


def test_max_usd_is_not_stored_so_a_resume_may_raise_it(tmp_path) -> None:
    save_run_config(resolve_run(tmp_path, resume=True, flags={"preset": "cpu_smoke"}).config)
    assert "max_usd" not in yaml.safe_load((tmp_path / CONFIG_NAME).read_text())
