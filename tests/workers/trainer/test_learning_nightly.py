"""The learning claim, end to end from the shipped base: a nightly check (`make test-all`), not a CI test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.nightly  # about 14 minutes on 2 idle cores: the whole `spotlight train` default run (make test-all)
@pytest.mark.timeout(2800)
def test_spotlight_train_raises_the_held_out_score_from_the_shipped_base(tmp_path):
    """The issue's learning claim on one run seed, through the command a user runs.

    The figures over seeds are `spotlight bench recipe`'s (docs/BENCHMARKS.md: +0.149 on
    average over eight). One run's gain varies from seed to seed by about 0.04 and float order
    differs between CPUs, so this asserts a gain every run of this preset has cleared with a
    margin (the lowest seen: +0.094), not the average. A loop that does not update ends
    exactly at the base; one that learns the wrong way, below it.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "2"}  # the 2 cores, whatever this machine has
    spotlight = Path(sys.executable).parent / "spotlight"
    out = subprocess.run(
        [str(spotlight), "train", "--json", "--seed", "0", "--out", str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=2700,
    )  # a hang guard: 13-16 min idle
    assert out.returncode == 0, out.stderr[-2000:]
    records = [json.loads(line) for line in out.stdout.splitlines()]
    scores = [(r["iteration"], r["validation_score"]) for r in records if r["validation_score"] is not None]
    (first_it, base), (last_it, final) = scores[0], scores[-1]
    assert first_it == 0 and last_it == records[-1]["iteration"] == 40
    assert (tmp_path / "run" / "policy" / "policy.json").is_file() and (
        tmp_path / "run" / "report" / "index.html"
    ).is_file()
    assert final - base >= 0.06, f"held-out strict {base:.3f} -> {final:.3f}; curve {scores}"
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") == len(records)
