"""`spotlight run --resume` as the reserved node uses it (resume-or-start), and the --max-usd spend cap."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.run import SPEC_NAME, BudgetReachedError, RunSpec, check_budget


def test_resume_on_a_fresh_folder_starts_the_run_and_later_continues_it(tmp_path) -> None:
    spec = RunSpec.resolve(tmp_path / "cloud", resume=True, preset="cpu_smoke", iterations=2)
    assert (spec.preset, spec.iterations) == ("cpu_smoke", 2)
    spec.save()
    again = RunSpec.resolve(tmp_path / "cloud", resume=True, preset="cpu_smoke")  # the node restarted
    assert again == spec
    with pytest.raises(ValueError, match="--iterations 5 .*run has 2"):
        RunSpec.resolve(tmp_path / "cloud", resume=True, iterations=5)


def test_resume_refuses_a_folder_with_a_ledger_but_no_run_spec(tmp_path) -> None:
    (tmp_path / "ledger.duckdb").write_bytes(b"")
    with pytest.raises(ValueError, match=f"holds a ledger but no {SPEC_NAME}"):
        RunSpec.resolve(tmp_path, resume=True)


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
    assert not (tmp_path / "r" / SPEC_NAME).exists()


def test_max_usd_is_not_stored_so_a_resume_may_raise_it(tmp_path) -> None:
    RunSpec.resolve(tmp_path, resume=True, preset="cpu_smoke").save()
    assert "max_usd" not in json.loads((tmp_path / SPEC_NAME).read_text())
