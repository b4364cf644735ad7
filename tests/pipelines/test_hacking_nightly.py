"""The hackable run (docs/REWARD_HACKING.md): the tiny model trained on jpeg_compressibility with minigeneval as
gold is flagged at its first validation after the base, rolled back, and ends on weights scoring at least the
base's gold. About 2.5 CPU-minutes: nightly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HACKABLE = [
    "train",
    "--preset",
    "cpu_tiny",
    "--iterations",
    "10",
    "--reward",
    "jpeg_compressibility",
    "--validation-reward",
    "minigeneval",
    "--on-hacking",
    "rollback",
    "--seed",
    "0",
    "--json",
]


@pytest.mark.nightly
@pytest.mark.timeout(1800)
def test_a_hacked_run_is_flagged_rolled_back_and_ends_no_worse_than_the_base(tmp_path):
    import torch

    from resources.ledger import Ledger
    from resources.store import open_store
    from workers.coordinator.hacking_guard import guard_best_key
    from workers.trainer.checkpoint import load_checkpoint

    out = tmp_path / "hack"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "spotlight"), *HACKABLE, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1700,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = {r["iteration"]: r for r in map(json.loads, done.stdout.splitlines())}
    assert records[5]["hacking_flagged"] and records[5]["hacking_action"] == "rollback"  # the first validation
    assert records[6]["learning_rate"] == pytest.approx(records[0]["learning_rate"] / 2)
    ledger = Ledger(out / "ledger.duckdb")
    base_gold = ledger.query("SELECT gold FROM reward_hacking WHERE weights_version = 0").rows[0][0]
    restored, gold = ledger.query(
        "SELECT restored_version, restored_gold FROM hacking_rollbacks ORDER BY iteration DESC LIMIT 1"
    ).rows[0]
    final = records[10]
    # Either the final validation was flagged and its weights replaced by the best gold's (the guard's copy), or
    # it was not and its own gold stands: both at least the base's.
    if final["hacking_flagged"]:
        store = open_store(str(out / "store"))
        ends_on = load_checkpoint(store, "hack", 10)[0].weights()
        best = store.load_tensors(guard_best_key("hack"))
        assert gold >= base_gold and all(torch.equal(ends_on[k], best[f"policy.{k}"]) for k in ends_on)
    else:
        assert final["gold_heldout"] >= base_gold
