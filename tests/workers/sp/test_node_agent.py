"""The node agent (workers/sp/node_agent.py): groups that lose or gain a member finish their requests.

One scenario runs on three real worker processes (spawned once for the module):
w0 and w1 load the weights from the tensor store, w2 joins by copying them from a peer
through shared memory. A degree-2 group samples a request uninterrupted; then the same
request again while w1 is killed mid-request (w2 takes its place: degree 2 again); then
again while w2 is killed (the survivor continues alone at degree 1).

Tolerances: a request resumed at the same degree is bit-identical to an uninterrupted
one (same collectives, same counter-based noise). Resumed at another degree it matches
to SP_ATOL = 1e-5 (fp32 forwards): the velocity at degree 1 and degree 2 differs in the
order of floating-point sums (about 1e-7), never in the noise.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from resources.keys import anchor_key
from workers.algo.sampler import SamplerConfig, rollout
from workers.model.tiny_policy import PolicyConfig, build_policy
from workers.sp.node_agent import AgentConfig, NodeAgent, SPRequest

SP_ATOL = 1e-5
TINY = PolicyConfig(image_size=16, num_layers=1, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
SAMPLER = SamplerConfig(num_steps=6, noise_level=0.7, forward_dtype="fp32")


def _request(rid: str) -> SPRequest:
    return SPRequest(rid, "a red circle", seed=11, sampler=SAMPLER)


def _kill_at(agent: NodeAgent, request_id: str, step: int, victim: str):
    def on_dispatch(rid: str, at_step: int) -> None:
        if rid == request_id and at_step == step and victim in agent.workers:
            agent.kill(victim)

    return on_dispatch


@pytest.fixture(scope="module")
def scenario(tmp_path_factory):
    from resources.store.local import LocalTensorStore

    store_dir = tmp_path_factory.mktemp("store")
    policy = build_policy(TINY, seed=3)
    LocalTensorStore(store_dir).publish_tensors(anchor_key("t", 0), policy.state_dict())
    out = {"single": rollout(policy.eval(), ["a red circle"], [11], SAMPLER)}
    config = AgentConfig(policy_config=TINY, store_url=str(store_dir), weights_key=anchor_key("t", 0), commit_every=2)
    agent = NodeAgent(config)
    procs = []
    try:
        w0, w1, w2 = agent.spawn(3)
        procs = [agent.workers[w].proc for w in (w0, w1, w2)]
        agent.load_from_store([w0, w1])
        agent.copy_from_peer(w2, peer=w0)
        out["hashes"] = {w: _ask_hash(agent, w) for w in (w0, w1, w2)}
        out["store_hash"] = agent.weights_hash
        out["groups"] = agent.form(degree=2).groups
        out["uninterrupted"] = agent.sample(_request("a"))
        out["replaced"] = agent.sample(_request("b"), on_dispatch=_kill_at(agent, "b", 2, w1))
        out["groups_after_replace"] = agent.groups
        out["shrunk"] = agent.sample(_request("c"), on_dispatch=_kill_at(agent, "c", 4, w2))
        out["groups_after_shrink"] = agent.groups
        out["latency_s"] = dict(agent.latency_s)
    finally:
        agent.close()
    out["alive_after_close"] = [p.is_alive() for p in procs]
    return out


def _ask_hash(agent: NodeAgent, wid: str) -> str:
    agent.workers[wid].send({"op": "hash"})
    return agent.workers[wid].expect("hash")["hash"]


def test_joining_worker_weights_hash_equals_its_peers(scenario):
    hashes = scenario["hashes"]
    assert hashes["w2"] == hashes["w0"] == hashes["w1"] == scenario["store_hash"]


def test_sp_group_result_matches_a_single_process(scenario):
    got, want = scenario["uninterrupted"], scenario["single"]
    assert scenario["groups"] == [["w0", "w1"]]
    np.testing.assert_allclose(got.latents.numpy(), want.images.numpy(), rtol=0, atol=SP_ATOL)
    np.testing.assert_allclose(got.log_probs.numpy(), want.log_probs.numpy(), rtol=0, atol=SP_ATOL)


def test_member_lost_mid_request_and_replaced_gives_bit_identical_result(scenario):
    assert scenario["groups_after_replace"] == [["w0", "w2"]]
    got, want = scenario["replaced"], scenario["uninterrupted"]
    assert got.step == SAMPLER.num_steps
    assert torch.equal(got.latents, want.latents)
    assert torch.equal(got.log_probs.nan_to_num(), want.log_probs.nan_to_num())


def test_member_lost_mid_request_without_spare_finishes_alone(scenario):
    assert scenario["groups_after_shrink"] == [["w0"]]
    got, want = scenario["shrunk"], scenario["uninterrupted"]
    assert got.step == SAMPLER.num_steps
    torch.testing.assert_close(got.latents, want.latents, rtol=0, atol=SP_ATOL)
    torch.testing.assert_close(got.log_probs, want.log_probs, rtol=0, atol=SP_ATOL, equal_nan=True)


def test_closing_the_agent_leaves_no_worker_process(scenario):
    assert scenario["alive_after_close"] == [False, False, False]


def test_a_bad_agent_config_or_request_payload_is_refused_before_any_worker_starts(tmp_path):
    with pytest.raises(ValueError, match="commit_every"):
        AgentConfig(policy_config=TINY, store_url=str(tmp_path), weights_key="k", commit_every=0)
    with pytest.raises(ValueError, match="payload lacks"):
        SPRequest.from_payload("r", {"prompt": "a red circle"})


def test_the_20b_projection_adds_the_measured_fixed_costs_to_the_assumed_transfer_times():
    """The projection's only inputs from this machine are the measured rendezvous and process start: each must
    move its path's total by exactly its own amount, and nothing else."""
    from workers.bench.projection import project_20b

    def figures(elastic_rdv: float, naive_rdv: float, start: float) -> dict:
        return project_20b(
            {
                "elastic": {"join": {"rendezvous_s": elastic_rdv, "process_start_s": 99.0}},
                "naive": {"join": {"rendezvous_s": naive_rdv, "process_start_s": start}},
            }
        )

    base = figures(0.1, 0.2, 10.0)
    assert base["label"].startswith("PROJECTION") and "NCCL" in base["excluded"]
    assert base["elastic.total_s"] == pytest.approx(0.1 + base["elastic.weight_transfer_s"], abs=1e-3)
    for case in ("best", "typical"):  # each figure is rounded to 0.01 s
        transfer_s = base[f"naive_{case}.weight_transfer_s"]
        assert base[f"naive_{case}.total_s"] == pytest.approx(10.2 + transfer_s, abs=0.02)
    moved = figures(1.1, 2.2, 13.0)  # +1 s elastic rendezvous; +2 s naive rendezvous, +3 s process start
    assert moved["elastic.total_s"] - base["elastic.total_s"] == pytest.approx(1.0, abs=1e-3)
    for case in ("best", "typical"):
        assert moved[f"naive_{case}.total_s"] - base[f"naive_{case}.total_s"] == pytest.approx(5.0, abs=0.02)
        assert moved[f"naive_{case}.weight_transfer_s"] == base[f"naive_{case}.weight_transfer_s"]
    assert moved["elastic.weight_transfer_s"] == base["elastic.weight_transfer_s"]
