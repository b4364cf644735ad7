"""The report's per-component progress: each multi-reward component in units of its own first spread, so a stalled
component shows flat beside one that climbs, over the rollouts and over the held-out images."""

import json

import pytest

from resources.ledger import Ledger
from resources.ledger.records import HackingSignalsRecord, RequestRecord, components_json
from workers.coordinator.report import write_report
from workers.coordinator.report_rewards import component_progress, progress


def _requests(iteration: int, ocr: list[float], pick: list[float]) -> list[RequestRecord]:
    return [
        RequestRecord(
            f"r-{iteration}-{n}",
            iteration,
            "rollout",
            "a sign",
            seed=n,
            weights_version=iteration,
            worker_id="trainer",
            attempts=1,
            reward=o + p,
            reward_components=components_json({"ocr": o, "pick": p}),
        )
        for n, (o, p) in enumerate(zip(ocr, pick, strict=True))
    ]


def _heldout(k: int, ocr: float, pick: float) -> HackingSignalsRecord:
    return HackingSignalsRecord(
        iteration=k,
        weights_version=k,
        proxy_reward="multi:ocr=1,pick=1",
        proxy=ocr + pick,
        proxy_se=0.01,
        gold_reward="minigeneval",
        gold=0.5,
        gold_se=0.01,
        proxy_components=json.dumps({"ocr": ocr, "pick": pick}),
    )


def test_a_stalled_component_shows_flat_beside_one_that_climbs_in_its_own_units():
    ledger = Ledger.in_memory()
    # iteration 0: ocr spread 0.01 (mean 0.50), pick spread 5 (mean 20); iteration 1: ocr +0.02, pick +5
    ledger.record_requests(_requests(0, [0.49, 0.51], [15.0, 25.0]))
    ledger.record_requests(_requests(1, [0.51, 0.53], [20.0, 30.0]))
    ledger.record_hacking_signals(_heldout(0, 0.50, 20.0))
    ledger.record_hacking_signals(_heldout(5, 0.50, 30.0))
    rollout, heldout = component_progress(ledger)
    assert rollout["ocr"][0] == [0, 1] and rollout["ocr"][1] == pytest.approx([0.0, 2.0])  # +0.02 = 2 spreads
    assert rollout["pick"][1] == pytest.approx([0.0, 1.0])  # +5 = 1 spread: the raw sum hides ocr's gain
    assert heldout["ocr"] == ([0, 5], pytest.approx([0.0, 0.0]))  # ocr stalled on the held-out images
    assert heldout["pick"][1] == pytest.approx([0.0, 2.0])


def test_a_component_without_a_spread_shows_its_raw_change():
    series = progress([("a", 0, 1.0), ("a", 1, 1.5), ("b", 0, 2.0)], {"a": 0.0})
    assert series == {"a": ([0, 1], [0.0, 0.5]), "b": ([0], [0.0])}


def test_the_report_draws_the_components_of_a_multi_reward_run(tmp_path, tmp_store):
    ledger = Ledger.in_memory()
    ledger.record_requests(_requests(0, [0.49, 0.51], [15.0, 25.0]))
    ledger.record_hacking_signals(_heldout(0, 0.50, 20.0))
    written = write_report(ledger, tmp_store, "demo", tmp_path / "report")
    assert written.plots["components"].startswith(b"\x89PNG")
    assert (tmp_path / "report" / "components.png").read_bytes() == written.plots["components"]
