"""Sequence parallelism (workers/sp/ulysses.py): an SP group samples what one process samples.

Tolerance: with fp32 forwards the SP rollout's images and log-probs match the
single-process rollout to SP_ATOL = 1e-5 absolute (measured: about 2e-7; the all-to-all
changes the order of floating-point sums, so bit-identity across degrees is not expected).
At the same degree, re-forming the group gives bit-identical results.
"""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
import torch

from workers.algo.sampler import SamplerConfig, rollout
from workers.model.tiny_policy import PolicyConfig, build_policy
from workers.sp.ulysses import SequenceParallelPolicy, allowed_degrees, check_sp_degree, pad_text

SP_ATOL = 1e-5
TINY = PolicyConfig(image_size=16, num_layers=1, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
SAMPLER = SamplerConfig(num_steps=4, noise_level=0.7, forward_dtype="fp32")
PROMPTS, SEEDS = ["a red circle", "two blue squares"], [7, 8]


def _rank_main(rank: int, port: int, out) -> None:
    """One SP rank: degree 2 twice (two generations), then alone again; results as numpy."""
    torch.set_num_threads(1)
    from workers.sp.ulysses import join_group, leave_group

    policy = build_policy(TINY, seed=0).eval()
    store = torch.distributed.TCPStore(
        "127.0.0.1", port, is_master=False, timeout=torch.distributed.constants.default_pg_timeout
    )
    results = {}
    for gen in ("gen0", "gen1"):
        join_group(policy, store, gen, rank, 2)
        traj = rollout(SequenceParallelPolicy(policy, 2), PROMPTS, SEEDS, SAMPLER)
        results[gen] = (traj.images.numpy().copy(), traj.log_probs.numpy().copy())
    leave_group(policy)
    traj = rollout(policy, PROMPTS, SEEDS, SAMPLER)
    results["alone"] = (traj.images.numpy().copy(), traj.log_probs.numpy().copy())
    out.put((rank, results))


@pytest.fixture(scope="module")
def sp_results():
    """Run two SP ranks in fresh processes; every child is joined or killed before the test ends."""
    ctx = mp.get_context("spawn")
    master = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True)
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, master.port, out), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    try:
        results = dict(out.get(timeout=600) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
                p.join()
    return results


@pytest.fixture(scope="module")
def single():
    traj = rollout(build_policy(TINY, seed=0).eval(), PROMPTS, SEEDS, SAMPLER)
    return traj.images.numpy(), traj.log_probs.numpy()


@pytest.mark.slow  # spawns two processes (~30 s here); test_node_agent.py covers SP = single process fast
def test_sp_degree_2_rollout_matches_single_process(sp_results, single):
    for rank in (0, 1):
        images, log_probs = sp_results[rank]["gen0"]
        np.testing.assert_allclose(images, single[0], rtol=0, atol=SP_ATOL)
        np.testing.assert_allclose(log_probs, single[1], rtol=0, atol=SP_ATOL)


@pytest.mark.slow  # spawns two processes (~30 s here); test_node_agent.py covers SP = single process fast
def test_every_rank_holds_the_same_state(sp_results):
    for gen in ("gen0", "gen1"):
        for a, b in zip(sp_results[0][gen], sp_results[1][gen], strict=False):
            assert np.array_equal(a, b)


@pytest.mark.slow  # spawns two processes (~30 s here); test_node_agent.py covers SP = single process fast
def test_reformed_group_at_same_degree_is_bit_identical(sp_results):
    for rank in (0, 1):
        for a, b in zip(sp_results[rank]["gen0"], sp_results[rank]["gen1"], strict=False):
            assert np.array_equal(a, b)


@pytest.mark.slow  # spawns two processes (~30 s here); test_node_agent.py covers SP = single process fast
def test_leaving_the_group_restores_the_single_process_model(sp_results, single):
    for rank in (0, 1):
        images, log_probs = sp_results[rank]["alone"]
        assert np.array_equal(images, single[0]) and np.array_equal(log_probs, single[1], equal_nan=True)


def test_degree_must_divide_heads_and_image_tokens():
    check_sp_degree(TINY, 2)
    with pytest.raises(ValueError, match="num_heads"):
        check_sp_degree(TINY, 4)
    with pytest.raises(ValueError, match=">= 1"):
        check_sp_degree(TINY, 0)
    assert allowed_degrees(PolicyConfig(), 8) == [1, 2, 4]


def test_padding_the_text_does_not_change_the_velocity(tiny_policy):
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    sigma = torch.full((2,), 0.5)
    emb, mask = tiny_policy.encode_prompts(PROMPTS)
    with torch.no_grad():
        v = tiny_policy.velocity(x, sigma, emb, mask)
        v_padded = tiny_policy.velocity(x, sigma, *pad_text(emb, mask, 4))
    assert pad_text(emb, mask, 4)[0].shape[1] == 12
    torch.testing.assert_close(v_padded, v, rtol=0, atol=SP_ATOL)


# ----- the SP degree policy (workers/sp/degree.py) -----

LATENCY = {1: 2.0, 2: 1.2, 4: 0.8}


def test_deep_queue_keeps_every_worker_on_its_own_request():
    from workers.sp.degree import choose_sp_degree

    choice = choose_sp_degree(4, queue_depth=16, latency_s=LATENCY)
    assert (choice.degree, choice.num_groups, choice.makespan_s) == (1, 4, 8.0)


def test_single_request_uses_all_workers_to_cut_its_latency():
    from workers.sp.degree import choose_sp_degree

    assert choose_sp_degree(4, queue_depth=1, latency_s=LATENCY).degree == 4
    assert choose_sp_degree(4, queue_depth=2, latency_s=LATENCY).degree == 2
    assert choose_sp_degree(3, queue_depth=1, latency_s=LATENCY).degree == 2  # 4 does not fit


def test_degree_changes_only_when_it_saves_more_than_a_reform():
    from workers.sp.degree import choose_sp_degree

    lat = {1: 1.0, 2: 0.95}
    assert choose_sp_degree(2, 1, lat).degree == 2
    assert choose_sp_degree(2, 1, lat, current_degree=1, reform_s=0.2).degree == 1
    assert choose_sp_degree(2, 0, LATENCY).degree == 1  # nothing queued: smallest groups


def test_slower_sp_is_never_chosen():
    from workers.sp.degree import amdahl_latency_s, choose_sp_degree

    slow_sp = {1: 1.0, 2: amdahl_latency_s(1.0, 2, parallel_fraction=0.9, comm_s=0.6)}
    assert slow_sp[2] == pytest.approx(1.15)
    assert choose_sp_degree(2, 1, slow_sp).degree == 1


def test_degree_policy_rejects_bad_input():
    from workers.sp.degree import choose_sp_degree

    with pytest.raises(ValueError, match="num_workers"):
        choose_sp_degree(0, 1, LATENCY)
    with pytest.raises(ValueError, match="queue_depth"):
        choose_sp_degree(2, -1, LATENCY)
    with pytest.raises(ValueError, match="no degree"):
        choose_sp_degree(1, 1, {2: 1.0})
    with pytest.raises(ValueError, match="latencies"):
        choose_sp_degree(2, 1, {1: 0.0})
