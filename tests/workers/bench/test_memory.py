"""`spotlight bench memory`: one iteration per size in a fresh process, its peak RSS reported."""

import json

import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from workers.model.families.tiny import build_tiny_pipeline


@pytest.mark.nightly
@pytest.mark.slow
def test_bench_memory_reports_each_iterations_peak_from_a_fresh_process(tmp_path):
    model = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    done = CliRunner().invoke(
        app,
        [
            "bench",
            "memory",
            "--model",
            str(model),
            "--samples",
            "8",
            "--samples",
            "16",
            "--rollout-batch",
            "4",
            "--micro-batch",
            "4",
            "--resolution",
            "32",
            "--threads",
            "1",
            "--json",
        ],
        catch_exceptions=False,
    )
    assert done.exit_code == 0, done.output[-2000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["samples"] for r in figures["runs"]] == [8, 16]
    assert all(r["peak_rss_GB"] > r["rss_after_load_GB"] > 0 and r["optimizer_steps"] == 1 for r in figures["runs"])
    assert figures["ratio"] == pytest.approx(
        figures["runs"][1]["peak_rss_GB"] / figures["runs"][0]["peak_rss_GB"], abs=1e-3
    )


def test_bench_memory_refuses_a_size_that_is_not_a_multiple_of_the_group(tmp_path):
    model = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    done = CliRunner().invoke(app, ["bench", "memory", "--model", str(model), "--samples", "12"])
    assert done.exit_code != 0 and "multiples of group_size=8" in done.output
