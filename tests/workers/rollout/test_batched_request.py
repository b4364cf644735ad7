"""A batched rollout request (one prompt, several seeds, one fixed batch) commits one result per sample, each in
the format of a request of its own, and resumes bit-identically after a preemption."""

from __future__ import annotations

import pytest

from resources.keys import rollout_key, rollout_state_key
from resources.queue.records import Request
from resources.store.local import LocalTensorStore
from tests.hooks import stop_after
from workers.algo.sampler import SamplerConfig
from workers.coordinator.rollout import PlannedRequest, queue_batches
from workers.rollout.request import StepHooks, work_request
from workers.rollout.state import RolloutSpec, rollout_request
from workers.rollout.weights import PolicyHolder, publish_policy

SAMPLER = SamplerConfig(num_steps=6, noise_level=0.7, sde_window=(0, 3))
SEEDS = [11, 12, 13, 14]
IDS = [f"it0-p0-s{j}" for j in range(len(SEEDS))]
ONE = [RolloutSpec("demo", "two red circles", s, 0, SAMPLER) for s in SEEDS]
BATCH = RolloutSpec.batched(ONE, IDS)


def _request(spec: RolloutSpec, rid: str = "it0-p0-s0x4") -> Request:
    return Request.from_dict(rollout_request(rid, 0, spec))


def _results(store) -> list[dict]:
    return [dict(store.read_manifest(rollout_key("demo", 0, sid)).metadata) for sid in IDS]


def test_a_batch_commits_one_result_per_sample_and_resumes_after_a_preemption(
    rollout_store, tiny_policy, tmp_path
) -> None:
    holder = PolicyHolder(rollout_store)
    first = work_request(
        _request(BATCH),
        1,
        rollout_store,
        holder,
        worker_id="a",
        commit_every=2,
        hooks=StepHooks(should_stop=stop_after(3)),
    )
    assert first.status == "preempted" and first.committed_step == 3
    assert rollout_store.read_manifest(rollout_key("demo", 0, IDS[0])) is None  # nothing published part-way
    second = work_request(_request(BATCH), 2, rollout_store, PolicyHolder(rollout_store), worker_id="b", commit_every=2)
    assert second.status == "done" and second.resumed_from_step == 3
    results = _results(rollout_store)
    # Each sample's result is what the trainer reads for a request of that sample alone.
    assert [m["fingerprint"] for m in results] == [s.fingerprint for s in ONE]
    assert [m["seed"] for m in results] == SEEDS
    assert rollout_store.list_keys(rollout_state_key("demo", "it0-p0-s0x4") + "/") == []
    tensors = rollout_store.load_tensors(rollout_key("demo", 0, IDS[2]))
    assert tuple(tensors["latents"].shape)[0] == SAMPLER.num_steps + 1 and tensors["image"].ndim == 3

    # Bit-identical to the same batch sampled without interruption.
    clean_store = LocalTensorStore(tmp_path / "clean")
    publish_policy(clean_store, "demo", tiny_policy)
    clean = work_request(_request(BATCH), 1, clean_store, PolicyHolder(clean_store), worker_id="c", commit_every=8)
    assert clean.status == "done"
    assert [m["result_hash"] for m in _results(clean_store)] == [m["result_hash"] for m in results]


def test_a_batch_whose_results_are_all_committed_is_already_done(rollout_store) -> None:
    holder = PolicyHolder(rollout_store)
    assert work_request(_request(BATCH), 1, rollout_store, holder, worker_id="a", commit_every=8).status == "done"
    again = work_request(_request(BATCH), 2, rollout_store, holder, worker_id="b", commit_every=8)
    assert again.status == "already_done" and not again.won


def test_bad_batched_payloads_are_refused_before_sampling() -> None:
    payload = BATCH.to_payload()
    assert RolloutSpec.from_payload(payload) == BATCH
    assert "batch_seeds" not in ONE[0].to_payload()  # a one-sample request's payload (and fingerprint) is unchanged
    for bad, message in [
        ({"sample_ids": IDS[:2]}, "one sample id per seed"),
        ({"batch_seeds": [12, "x", 14]}, "seed must be an int"),
        ({"sample_ids": [IDS[0]] * 4}, "distinct"),
        ({"sample_ids": ["../x", *IDS[1:]]}, "sample id"),
        ({"batch_seeds": 12}, "must be lists"),
    ]:
        with pytest.raises(ValueError, match=message):
            RolloutSpec.from_payload({**payload, **bad})
    with pytest.raises(ValueError, match="differ only in their seed"):
        RolloutSpec.batched([ONE[0], RolloutSpec("demo", "a red circle", 12, 0, SAMPLER)], IDS[:2])


def test_queue_batches_cut_each_prompt_in_order() -> None:
    specs = [
        PlannedRequest(f"it0-p{i}-s{j}", i, j, RolloutSpec("demo", "a red circle", 100 * i + j, 0, SAMPLER))
        for i in range(2)
        for j in range(5)
    ]
    batches = queue_batches(specs, 2)
    assert [rid for rid, _ in batches] == [
        "it0-p0-s0x2",
        "it0-p0-s2x2",
        "it0-p0-s4",
        "it0-p1-s0x2",
        "it0-p1-s2x2",
        "it0-p1-s4",
    ]
    assert (
        batches[0][1].seeds == (0, 1)
        and batches[2][1].seeds == (4,)
        and batches[3][1].sample_ids == ("it0-p1-s0", "it0-p1-s1")
    )
    assert [rid for rid, _ in queue_batches(specs, 1)] == [s.request_id for s in specs]
