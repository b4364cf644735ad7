"""Exploration requests on an SP node (workers/sp/node_explore.py): one per member, the rollout worker's rewards.

The reference is the rollout worker's `work_explore_request` in this process, on a second store holding the same run.
A member explores alone at degree 1 with its group's Ulysses hooks off, so its rewards are the rollout worker's bits.
"""

from __future__ import annotations

import threading

import pytest
import torch

from resources.keys import explore_result_key, rollout_key
from resources.queue.records import Request
from resources.store.local import LocalTensorStore
from tests.workers.sp.tiny_run import PROMPTS, RUN, SAMPLER, tiny_run
from workers.explore.request import ExploreSpec


def _explore_request(request_id: str, prompt: str, seeds: tuple[int, ...]) -> dict:
    spec = ExploreSpec(RUN, prompt, seeds, 0, SAMPLER, "half_steps", "jpeg_compressibility")
    return {"request_id": request_id, "iteration": 0, "kind": "explore", "payload": spec.to_payload()}


@pytest.mark.slow  # two device workers as processes and three rounds (~45 s here)
def test_a_node_explores_one_request_per_member_between_rollouts_at_degree_two(tmp_path, qwen4):
    from resources.queue import open_queue
    from workers.explore.request import work_explore_request
    from workers.rollout.weights import PolicyHolder
    from workers.sp.node_agent import AgentConfig, NodeAgent
    from workers.sp.node_requests import RequestServer, ServeConfig

    ref, sp = LocalTensorStore(tmp_path / "ref"), LocalTensorStore(tmp_path / "sp")
    run = tiny_run(qwen4, [ref, sp], num_requests=1)
    explores = [_explore_request("e0", PROMPTS[0], (3, 4, 5)), _explore_request("e1", PROMPTS[1], (6, 7))]
    again = {**run.requests[0], "request_id": "r0-again"}  # the same rollout, once the members have explored
    events = []
    with open_queue(tmp_path / "queue.db") as queue, NodeAgent(AgentConfig(store_url=sp.url)) as agent:
        agent.spawn(2)
        server = RequestServer(
            agent,
            queue,
            sp,
            lambda event, **f: events.append({"event": event, **f}),
            ServeConfig("n0", degree=2),
            threading.Event(),
        )
        for batch in ([run.requests[0], *explores], [again]):
            queue.put(batch)
            leases = [queue.claim("n0", 60.0) for _ in batch]
            assert [lease.request.kind for lease in leases] == [b["kind"] for b in batch]  # rollouts are claimed first
            server.serve(leases)
        assert queue.stats().done == 4 and not queue.dead_letters(), [e for e in events if e["event"] == "failed"]
    for body in explores:
        want = work_explore_request(Request.from_dict(body), ref, PolicyHolder(ref), worker_id="plain").rewards
        got = sp.read_manifest(explore_result_key(RUN, 0, body["request_id"])).metadata
        assert got["rewards"] == want, "a member alone must compute the rollout worker's rewards bit for bit"
    explored = {e["request_id"]: e["group"] for e in events if e["event"] == "acked" and e["request_id"][0] == "e"}
    assert explored == {"e0": "w0", "e1": "w1"}, "one request per member, at once"
    assert [e["degree"] for e in events if e["event"] == "formed"] == [2], "exploring left the group of two formed"
    first, second = (sp.load_tensors(rollout_key(RUN, 0, rid))["latents"] for rid in ("r0", "r0-again"))
    assert torch.equal(first, second), "after exploring, the group samples at degree 2 again, bit for bit"
