"""PULSE version chains: anchors plus patches reproduce the sender's weights hash exactly."""

from __future__ import annotations

import pytest
import torch

from workers.bench.pulse_stats import single_thread
from workers.pulse import (
    ChainConfig,
    ChainPlan,
    ChainPublisher,
    MemoryChain,
    PatchError,
    plan_chain,
    read_patch_header,
    sync_weights,
    weights_hash,
)
from workers.pulse.loco.tiny_lm import LMConfig, TrajectoryConfig, lm_trajectory


def random_walk_states(num_versions: int, seed: int = 0) -> list[dict[str, torch.Tensor]]:
    """FP32 master weights taking small AdamW-like steps; the sender publishes each version."""
    generator = torch.Generator().manual_seed(seed)
    master = {
        "embed": torch.randn(300, 32, generator=generator) * 0.02,
        "proj": torch.randn(32, 32, generator=generator) * 0.02,
        "bias": torch.zeros(32),
        "gain": torch.tensor(1.0),
        "frozen": torch.randn(16, generator=generator),
    }
    states = []
    for _ in range(num_versions):
        states.append({name: tensor.clone() for name, tensor in master.items()})
        for name, tensor in master.items():
            if name != "frozen":
                tensor -= 2e-4 * torch.randn(tensor.shape, generator=generator).sign()
    return states


def published(states: list[dict], config: ChainConfig) -> tuple[MemoryChain, list[str]]:
    chain = MemoryChain()
    publisher = ChainPublisher(chain, config)
    for version, state in enumerate(states):
        publisher.publish(version, state)
    hashes = [weights_hash({n: t.to(torch.bfloat16) for n, t in state.items()}) for state in states]
    return chain, hashes


@pytest.mark.parametrize("mode", ["absolute", "ulp_delta"])
def test_chain_of_25_patches_with_anchors_every_10_reproduces_the_sender_hash(mode: str) -> None:
    config = ChainConfig(anchor_every=10, mode=mode)
    chain, hashes = published(random_walk_states(26), config)
    assert sorted(chain.anchors) == [0, 10, 20] and sorted(chain.patches) == list(range(1, 26))
    receiver: dict[str, torch.Tensor] = {}
    sync_weights(receiver, None, 0, chain, config)
    for version in range(1, 26):
        plan = sync_weights(receiver, version - 1, version, chain, config)
        assert plan == ChainPlan(anchor=None, patches=(version,))
        assert weights_hash(receiver) == hashes[version]


def test_fresh_receiver_reaches_version_25_from_anchor_20_and_five_patches() -> None:
    config = ChainConfig()
    chain, hashes = published(random_walk_states(26, seed=1), config)
    receiver: dict[str, torch.Tensor] = {}
    assert sync_weights(receiver, None, 25, chain, config) == ChainPlan(anchor=20, patches=(21, 22, 23, 24, 25))
    assert weights_hash(receiver) == hashes[25]


def test_receiver_far_behind_or_ahead_reloads_an_anchor_in_place() -> None:
    config = ChainConfig(max_patches=4)
    chain, hashes = published(random_walk_states(26, seed=2), config)
    receiver: dict[str, torch.Tensor] = {}
    sync_weights(receiver, None, 3, chain, config)
    storage = receiver["embed"].data_ptr()
    assert sync_weights(receiver, 3, 17, chain, config).anchor == 10
    assert weights_hash(receiver) == hashes[17]
    assert sync_weights(receiver, 17, 12, chain, config) == ChainPlan(anchor=10, patches=(11, 12))
    assert weights_hash(receiver) == hashes[12]
    assert receiver["embed"].data_ptr() == storage


def test_plan_chain_prefers_patches_within_max_patches() -> None:
    config = ChainConfig(anchor_every=10, max_patches=10)
    assert plan_chain(5, 15, config) == ChainPlan(anchor=None, patches=tuple(range(6, 16)))
    assert plan_chain(4, 15, config) == ChainPlan(anchor=10, patches=tuple(range(11, 16)))
    assert plan_chain(None, 9, config) == ChainPlan(anchor=0, patches=tuple(range(1, 10)))
    assert plan_chain(7, 7, config) == ChainPlan(anchor=None, patches=())


def test_chain_detects_a_tampered_anchor_by_the_final_hash() -> None:
    config = ChainConfig()
    chain, _ = published(random_walk_states(13, seed=3), config)
    # A tensor no patch touches: absolute patches would overwrite a tampered value that changes.
    chain.anchors[10]["frozen"].view(torch.int16)[0] += 1
    with pytest.raises(PatchError, match="does not match the sender's"):
        sync_weights({}, None, 12, chain, config)


def test_anchor_only_sync_checks_an_expected_hash_when_given() -> None:
    config = ChainConfig()
    chain, hashes = published(random_walk_states(11, seed=5), config)
    assert sync_weights({}, None, 10, chain, config, expected_hash=hashes[10]) == ChainPlan(anchor=10, patches=())
    with pytest.raises(PatchError, match="does not match the sender's"):
        sync_weights({}, None, 10, chain, config, expected_hash=hashes[9])


def test_chain_stops_at_the_version_before_a_refused_patch() -> None:
    config = ChainConfig(mode="ulp_delta")
    chain, hashes = published(random_walk_states(6, seed=4), config)
    chain.patches[4] = chain.patches[5]  # a patch stored under the wrong version
    receiver: dict[str, torch.Tensor] = {}
    with pytest.raises(PatchError, match="stopped at version 3"):
        sync_weights(receiver, None, 5, chain, config)
    assert weights_hash(receiver) == hashes[3]


def test_publisher_refuses_out_of_order_versions() -> None:
    publisher = ChainPublisher(MemoryChain(), ChainConfig())
    state = random_walk_states(1)[0]
    with pytest.raises(ValueError, match="anchor version"):
        publisher.publish(3, state)
    publisher.publish(0, state)
    with pytest.raises(ValueError, match="in order"):
        publisher.publish(2, state)


@pytest.fixture(scope="module")
def adamw_states() -> list[dict[str, torch.Tensor]]:
    """26 BF16 snapshots of a small transformer trained by AdamW (lr high enough to change every step)."""
    model = LMConfig(vocab_size=256, d_model=64, num_layers=2, num_heads=4, max_seq_len=16)
    run = TrajectoryConfig(warmup_steps=5, warmup_lr=3e-3, settle_steps=2, num_states=26, lr=1e-4, seq_len=16)
    # One thread: on a shared machine a second torch thread waiting for a busy core is ~10x slower.
    with single_thread():
        return list(lm_trajectory(model, run))


@pytest.mark.parametrize("mode", ["absolute", "ulp_delta"])
def test_chain_reproduces_an_adamw_trained_transformer_trajectory_exactly(adamw_states, mode: str) -> None:
    config = ChainConfig(mode=mode)
    chain, hashes = published(adamw_states, config)
    assert min(read_patch_header(chain.patches[v]).num_changed for v in range(1, 26)) > 0
    receiver: dict[str, torch.Tensor] = {}
    current = None
    for version in (7, 8, 15, 25):
        sync_weights(receiver, current, version, chain, config)
        assert weights_hash(receiver) == hashes[version]
        current = version
