"""PULSELoCo replicas as separate processes: identical global weights, transports, replica death, ledger."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from resources.ledger import Ledger
from resources.store_local import LocalTensorStore
from workers.pulse.loco_launch import LocoRunConfig, record_loco_ledger, run_loco, sync_totals
from workers.pulse.loco_tasks import TaskConfig
from workers.pulse.loco_transport import ExchangeConfig, ReplicaExcludedError, RoundTimeoutError, StoreExchange

SURVIVOR_WAIT_S = 4.0
"""Round timeout of the death test: long enough that a live replica's round never needs it."""
TINY_LM = TaskConfig(name="lm", size="tiny", warmup_steps=2, settle_steps=2, eval_batches=1)


def tiny_run(**changes) -> LocoRunConfig:
    return dataclasses.replace(LocoRunConfig(rounds=2, inner_steps=2, task=TINY_LM), **changes)


def assert_identical_weights_every_round(run, modes, num_rounds, num_replicas=2):
    for mode in modes:
        rows = sync_totals(run, mode)
        assert [row["round"] for row in rows] == list(range(num_rounds)), mode
        for row in rows:
            assert row["replicas"] == list(range(num_replicas)), (mode, row)
            assert row["weights_hash"] is not None, f"{mode} round {row['round']}: replicas disagree"
        assert len({row["weights_hash"] for row in rows}) == num_rounds, f"{mode}: weights did not move"


def test_pulseloco_replica_processes_over_gloo_end_every_round_with_bit_identical_weights(tmp_path: Path):
    run = run_loco(tiny_run(modes=("pulseloco",)), tmp_path, timeout_s=900)
    assert run.exit_codes == {0: 0, 1: 0}
    assert_identical_weights_every_round(run, ("pulseloco",), num_rounds=2)
    assert all(0 < row["density"] < 1 for row in sync_totals(run, "pulseloco"))


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["gloo", "store"])
def test_every_mode_ends_every_round_with_bit_identical_weights(tmp_path: Path, transport: str):
    modes = ("ddp", "diloco", "pulseloco")
    run = run_loco(tiny_run(modes=modes, transport=transport), tmp_path, timeout_s=900)
    assert run.exit_codes == {0: 0, 1: 0}
    assert_identical_weights_every_round(run, modes, num_rounds=2)
    diloco, pulse = sync_totals(run, "diloco"), sync_totals(run, "pulseloco")
    assert all(p["bytes_per_replica"] < d["bytes_per_replica"] for p, d in zip(pulse, diloco))


def test_a_round_completes_with_the_survivors_when_a_replica_dies(tmp_path: Path):
    config = tiny_run(rounds=3, transport="store", exchange=ExchangeConfig(timeout_s=SURVIVOR_WAIT_S, missing_policy="survivors"))
    config = dataclasses.replace(config, modes=("pulseloco",))
    run = run_loco(config, tmp_path, die_at={1: 1}, timeout_s=900)
    assert run.exit_codes == {0: 0, 1: 3}
    rows = sync_totals(run, "pulseloco")
    assert [row["replicas"] for row in rows] == [[0, 1], [0], [0]]
    assert rows[0]["weights_hash"] is not None  # both replicas agreed while both lived
    survivor = {e["round"]: e for e in run.rounds("pulseloco") if e["replica"] == 0}
    assert survivor[1]["sync_s"] >= SURVIVOR_WAIT_S  # waited for the dead replica once ...
    assert survivor[2]["sync_s"] < SURVIVOR_WAIT_S  # ... and not again: it left the group
    ledger_path = tmp_path / "ledger.duckdb"
    record_loco_ledger(ledger_path, "loco-test", config, run)
    with Ledger(ledger_path) as ledger:
        synced = ledger.query("SELECT version, kind, patch_bytes FROM syncs ORDER BY version").rows
    assert [(v, k) for v, k, _ in synced] == [(1, "patch"), (2, "patch"), (3, "patch")]
    assert synced[1][2] == survivor[1]["bytes_sent"]  # the survivor's bytes, counted once


@pytest.mark.slow
def test_a_round_waits_then_fails_clearly_when_a_replica_dies_under_the_wait_policy(tmp_path: Path):
    config = tiny_run(modes=("diloco",), transport="store", exchange=ExchangeConfig(timeout_s=2.0, missing_policy="wait"))
    run = run_loco(config, tmp_path, die_at={1: 1}, timeout_s=900)
    assert run.exit_codes == {0: 2, 1: 3}
    [timeout] = [e for e in run.events if e["event"] == "timeout"]
    assert timeout["round"] == 1 and "replicas [1] did not publish" in timeout["reason"]


@pytest.mark.slow
def test_a_gloo_round_fails_within_the_timeout_when_a_peer_dies(tmp_path: Path):
    config = tiny_run(modes=("pulseloco",), exchange=ExchangeConfig(timeout_s=5.0, missing_policy="wait"))
    run = run_loco(config, tmp_path, die_at={1: 1}, timeout_s=900)
    assert run.exit_codes == {0: 2, 1: 3}
    assert [e["round"] for e in run.events if e["event"] == "timeout"] == [1]


def test_a_late_payload_is_not_counted_and_its_sender_leaves_the_group(tmp_path: Path):
    store = LocalTensorStore(tmp_path, fsync=False)
    config = ExchangeConfig(timeout_s=0.2, join_timeout_s=0.2, missing_policy="survivors", poll_s=0.01)
    early, late = (StoreExchange(store, "loco/t", replica=r, num_replicas=2, config=config) for r in (0, 1))
    assert early.exchange(0, b"early").payloads == {0: b"early"}
    with pytest.raises(ReplicaExcludedError, match="was not counted"):
        late.exchange(0, b"late")
    assert early.exchange(1, b"next").payloads == {0: b"next"}  # no wait for the departed replica
    waiting = StoreExchange(store, "loco/w", replica=0, num_replicas=2,
                            config=dataclasses.replace(config, missing_policy="wait"))
    with pytest.raises(RoundTimeoutError, match=r"replicas \[1\]"):
        waiting.exchange(0, b"alone")
