"""In-flight state is a cache: two holders of one request never corrupt each other,
and damaged state means a fresh start."""

from __future__ import annotations

import pytest
import torch

from resources.keys import MANIFEST_NAME, rollout_state_key
from resources.queue.records import Request
from resources.store.local import LocalTensorStore
from resources.store.tensors import tensors_to_bytes
from tests.hooks import stop_after
from workers.algo.sampler import SamplerConfig
from workers.rollout.request import StepHooks, work_request
from workers.rollout.state import RolloutSpec, rollout_request
from workers.rollout.weights import PolicyHolder

SPEC = RolloutSpec("demo", "two red circles", 11, 0, SamplerConfig(num_steps=8, sde_window=(0, 4)))
STATE_PREFIX = rollout_state_key("demo", "r0") + "/"


class Killed(Exception):
    """A worker killed without notice (no commit, no release)."""


class InterleavingStore(LocalTensorStore):
    """The same folder, but just before its `nth` in-flight state manifest is written, another worker runs."""

    def __init__(self, root, nth: int, meanwhile) -> None:
        super().__init__(root)
        self.nth, self.meanwhile, self.seen = nth, meanwhile, 0

    def put_bytes(self, key: str, data: bytes) -> None:
        if key.startswith("runs/demo/rollout_state/") and key.endswith("/" + MANIFEST_NAME):
            self.seen += 1
            if self.seen == self.nth:
                self.meanwhile()
        super().put_bytes(key, data)


def _request(spec: RolloutSpec = SPEC) -> Request:
    return Request.from_dict(rollout_request("r0", 0, spec))


def _reference_hash(store) -> str:
    ref = Request.from_dict(rollout_request("ref", 0, SPEC))
    return work_request(ref, 1, store, PolicyHolder(store), worker_id="ref", commit_every=8).result_hash


def _kill_at(step: int):
    def after_step(flight) -> None:
        if flight.step == step:
            raise Killed

    return after_step


def test_two_holders_of_one_request_cannot_corrupt_each_others_state(rollout_store) -> None:
    # Worker A's lease expired while it kept working; the queue gave the request to B. B commits
    # (steps 4 and 6) between A reading the committed state and A writing its own manifest for step 4.
    def worker_b() -> None:
        b = work_request(
            _request(),
            2,
            rollout_store,
            PolicyHolder(rollout_store),
            worker_id="b",
            commit_every=2,
            hooks=StepHooks(should_stop=stop_after(4)),
        )
        assert b.status == "preempted" and b.committed_step == 6

    store_a = InterleavingStore(rollout_store.root, nth=2, meanwhile=worker_b)
    with pytest.raises(Killed):
        work_request(
            _request(),
            1,
            store_a,
            PolicyHolder(store_a),
            worker_id="a",
            commit_every=2,
            hooks=StepHooks(after_step=_kill_at(5)),
        )
    third = work_request(_request(), 3, rollout_store, PolicyHolder(rollout_store), worker_id="c", commit_every=2)
    assert third.status == "done" and third.resumed_from_step == 6  # B's progress kept, nothing lost or corrupted
    assert third.result_hash == _reference_hash(rollout_store)
    assert rollout_store.list_keys(STATE_PREFIX) == []  # every holder's state removed with the result


def _delete_object(store, key, manifest) -> None:
    store.delete(manifest.objects["tensors.safetensors"].key)


def _flip_a_bit(store, key, manifest) -> None:
    entry = manifest.objects["tensors.safetensors"]
    data = bytearray(store.get_bytes(entry.key))
    data[-1] ^= 0x01
    store.put_bytes(entry.key, bytes(data))


def _garble_manifest(store, key, manifest) -> None:
    store.put_bytes(f"{key}/{MANIFEST_NAME}", b'{"format": "spotlight-manifest/1", "objects": ')


def _wrong_shapes(store, key, manifest) -> None:
    tensors = {"latents": torch.zeros(5, 1, 3, 8, 8), "log_probs": torch.zeros(8, 1)}
    store.publish(key, {"tensors.safetensors": tensors_to_bytes(tensors)}, dict(manifest.metadata))


def _not_safetensors(store, key, manifest) -> None:
    store.publish(key, {"tensors.safetensors": b"\x00" * 64}, dict(manifest.metadata))


def _another_requests_state(store, key, manifest) -> str:
    store.delete_commit(key)
    other = RolloutSpec("demo", "two red circles", 12, 0, SPEC.sampler)
    work_request(
        _request(other),
        9,
        store,
        PolicyHolder(store),
        worker_id="x",
        commit_every=2,
        hooks=StepHooks(should_stop=stop_after(6)),
    )  # commits step 6 of seed 12 under request id r0
    [other_key] = store.list_commits(STATE_PREFIX)
    return other_key


@pytest.mark.parametrize(
    "damage", [_delete_object, _flip_a_bit, _garble_manifest, _wrong_shapes, _not_safetensors, _another_requests_state]
)
def test_unreadable_or_inconsistent_state_falls_back_to_a_fresh_start(rollout_store, damage) -> None:
    first = work_request(
        _request(),
        1,
        rollout_store,
        PolicyHolder(rollout_store),
        worker_id="w1",
        commit_every=2,
        hooks=StepHooks(should_stop=stop_after(4)),
    )
    assert first.status == "preempted" and first.committed_step == 4
    [key] = rollout_store.list_commits(STATE_PREFIX)
    key = damage(rollout_store, key, rollout_store.read_manifest(key)) or key
    events = []
    again = work_request(
        _request(),
        2,
        rollout_store,
        PolicyHolder(rollout_store),
        worker_id="w2",
        commit_every=2,
        hooks=StepHooks(report=lambda event, **f: events.append((event, f))),
    )
    assert again.status == "done" and again.resumed_from_step == 0
    assert again.result_hash == _reference_hash(rollout_store)
    discarded = [f for e, f in events if e == "state_discarded"]
    assert discarded and discarded[0]["key"] == key and discarded[0]["reason"]


def test_the_furthest_intact_state_wins_over_a_damaged_later_one(rollout_store) -> None:
    work_request(
        _request(),
        1,
        rollout_store,
        PolicyHolder(rollout_store),
        worker_id="w1",
        commit_every=2,
        hooks=StepHooks(should_stop=stop_after(2)),
    )
    work_request(
        _request(),
        2,
        rollout_store,
        PolicyHolder(rollout_store),
        worker_id="w2",
        commit_every=2,
        hooks=StepHooks(should_stop=stop_after(4)),
    )
    later = max(rollout_store.list_commits(STATE_PREFIX), key=lambda k: rollout_store.read_manifest(k).metadata["step"])
    _delete_object(rollout_store, later, rollout_store.read_manifest(later))
    again = work_request(_request(), 3, rollout_store, PolicyHolder(rollout_store), worker_id="w3", commit_every=2)
    assert again.resumed_from_step == 2 and again.result_hash == _reference_hash(rollout_store)


def test_a_duplicate_claim_of_a_finished_request_removes_state_a_stale_holder_left(rollout_store) -> None:
    done = work_request(_request(), 1, rollout_store, PolicyHolder(rollout_store), worker_id="w1", commit_every=2)
    # A holder whose lease had expired commits once more after the result landed.
    rollout_store.publish(STATE_PREFIX + "attempt-000002-late", {"tensors.safetensors": b"late"}, {"step": 6})
    again = work_request(_request(), 3, rollout_store, PolicyHolder(rollout_store), worker_id="w3", commit_every=2)
    assert again.status == "already_done" and again.result_hash == done.result_hash
    assert rollout_store.list_keys(STATE_PREFIX) == []
