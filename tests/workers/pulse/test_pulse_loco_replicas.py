"""PULSELoCo replicas as separate processes: identical global weights, transports, replica death, ledger."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from resources.ledger import Ledger
from resources.store.local import LocalTensorStore
from workers.coordinator.loco import record_loco_ledger
from workers.pulse.loco.launch import LocoRunConfig, run_loco, sync_totals
from workers.pulse.loco.tasks import TaskConfig
from workers.pulse.loco.transport import ExchangeConfig, ReplicaExcludedError, RoundTimeoutError, StoreExchange

SURVIVOR_WAIT_S = 4.0
"""Round timeout of the death test: long enough that a live replica's round never needs it. Measured at load
average 22 on the 2-core dev VM: the live replicas published round 1 within 0.09 s of each other (replica 0's
wait ended 0.09 s before its own 4 s deadline, at replica 2's), a 40x margin; the first round, where start-up
times differ by seconds, waits ExchangeConfig.join_timeout_s (600 s) instead."""
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
    assert all(p["bytes_per_replica"] < d["bytes_per_replica"] for p, d in zip(pulse, diloco, strict=False))


def test_rounds_complete_with_the_survivors_and_the_ledger_counts_each_payload_once(tmp_path: Path):
    # Replica 1 dies before sending round 1; replica 2 dies right after round 1 counted its payload,
    # before it could report the round. Replica 0 survives.
    # eval_every > rounds: replica 0 evaluates only before the first and after the last round, so a
    # live replica never arrives late because of its evaluation.
    config = tiny_run(
        modes=("pulseloco",),
        num_replicas=3,
        rounds=3,
        eval_every=10,
        transport="store",
        exchange=ExchangeConfig(timeout_s=SURVIVOR_WAIT_S, missing_policy="survivors"),
    )
    run = run_loco(config, tmp_path, die_at={1: 1}, die_after={2: 1}, timeout_s=900)
    assert run.exit_codes == {0: 0, 1: 3, 2: 3}
    rows = sync_totals(run, "pulseloco")
    assert [row["replicas"] for row in rows] == [[0, 1, 2], [0, 2], [0]]
    assert all(row["weights_hash"] is not None for row in rows)  # the survivors agreed every round
    survivor = {e["round"]: e for e in run.rounds("pulseloco") if e["replica"] == 0}
    assert [e["round"] for e in run.rounds("pulseloco") if e["replica"] == 2] == [0]  # replica 2 never reported round 1

    ledger_path = tmp_path / "ledger.duckdb"
    record_loco_ledger(ledger_path, "loco-test", config, run)
    record_loco_ledger(ledger_path, "loco-test", config, run)  # recording again replaces, never adds
    with Ledger(ledger_path) as ledger:
        synced = ledger.query(
            "SELECT version, kind, replica, patch_bytes, dense_bytes FROM syncs ORDER BY version, replica"
        ).rows
    assert [(v, k, r) for v, k, r, _, _ in synced] == [
        (1, "pulseloco", 0),
        (1, "pulseloco", 1),
        (1, "pulseloco", 2),
        (2, "pulseloco", 0),
        (2, "pulseloco", 2),
        (3, "pulseloco", 0),
    ]
    sent = {(e["round"] + 1, e["replica"]): e["bytes_sent"] for e in run.rounds("pulseloco")}
    counted_by_survivor = survivor[1]["counted"]["2"]["bytes"]
    assert [b for v, _, r, b, _ in synced] == [sent.get((v, r), counted_by_survivor) for v, _, r, _, _ in synced]
    assert all(dense == 4 * survivor[0]["numel"] > sent_bytes for _, _, _, sent_bytes, dense in synced)


def test_each_mode_writes_its_own_sync_kind_with_dense_bytes_of_the_same_exchange(tmp_path: Path):
    from workers.pulse.loco.launch import LocoRun

    def round_event(mode: str, replica: int, exchanges: int, size: int, values: int) -> dict:
        counted = {str(r): {"bytes": size, "values": values, "exchanges": exchanges} for r in (0, 1)}
        return {
            "event": "round",
            "mode": mode,
            "replica": replica,
            "round": 0,
            "numel": 100,
            "bytes_sent": size,
            "values_sent": values,
            "density": values / (100 * exchanges),
            "encode_s": 0.01,
            "sync_s": 0.0,
            "weights_hash": f"h-{mode}",
            "counted": counted,
        }

    events = [round_event("ddp", r, 8, 8 * 467, 800) for r in (0, 1)]
    events += [round_event("diloco", r, 1, 467, 100) for r in (0, 1)]
    events += [round_event("pulseloco", r, 1, 90, 5) for r in (0, 1)]
    config = LocoRunConfig(modes=("ddp", "diloco", "pulseloco"), rounds=1, inner_steps=8, task=TINY_LM)
    record_loco_ledger(tmp_path / "ledger.duckdb", "r", config, LocoRun(events, {0: 0, 1: 0}, 1.0))
    with Ledger(tmp_path / "ledger.duckdb") as ledger:
        rows = ledger.query(
            "SELECT kind, replica, dense_bytes, patch_bytes, changed_fraction FROM syncs ORDER BY kind, replica"
        ).rows
    assert rows == [
        ("ddp", 0, 3200, 3736, 1.0),
        ("ddp", 1, 3200, 3736, 1.0),
        ("diloco", 0, 400, 467, 1.0),
        ("diloco", 1, 400, 467, 1.0),
        ("pulseloco", 0, 400, 90, 0.05),
        ("pulseloco", 1, 400, 90, 0.05),
    ]


@pytest.mark.slow
def test_a_round_waits_then_fails_clearly_when_a_replica_dies_under_the_wait_policy(tmp_path: Path):
    config = tiny_run(
        modes=("diloco",), transport="store", exchange=ExchangeConfig(timeout_s=2.0, missing_policy="wait")
    )
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
    waiting = StoreExchange(
        store, "loco/w", replica=0, num_replicas=2, config=dataclasses.replace(config, missing_policy="wait")
    )
    with pytest.raises(RoundTimeoutError, match=r"replicas \[1\]"):
        waiting.exchange(0, b"alone")
