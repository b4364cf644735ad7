"""Cross-iteration state in the store: trainer checkpoints, seed plans, rollout batches, published versions."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from workers.trainer.grpo_trainer import GRPOTrainer
from workers.trainer.presets import get_preset


@pytest.fixture
def smoke_config():
    return get_preset("cpu_smoke")


def _tiny_folder(tiny_policy, tmp_path):
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "tiny")
    return tmp_path / "tiny"


def test_checkpoint_roundtrip_resumes_training_bit_identically(tmp_store, tiny_policy, smoke_config):
    from workers.trainer.checkpoint import load_checkpoint, restore_optimizer, save_checkpoint

    torch.set_num_threads(1)
    trainer = GRPOTrainer(tiny_policy, smoke_config)
    trainer.update(trainer.collect(0))
    save_checkpoint(tmp_store, "demo", 1, tiny_policy, trainer.optimizer)
    batch = trainer.collect(1)
    trainer.update(batch)
    expected = {k: v.clone() for k, v in tiny_policy.state_dict().items()}

    policy, opt = load_checkpoint(tmp_store, "demo", 1)
    fresh = GRPOTrainer(policy, smoke_config)
    restore_optimizer(fresh.optimizer, opt)
    fresh.update(fresh.collect(1))
    for name, tensor in policy.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_missing_checkpoint_names_the_phase_to_run_first(tmp_store):
    from workers.trainer.checkpoint import load_checkpoint

    with pytest.raises(LookupError, match="policy_update"):
        load_checkpoint(tmp_store, "demo", 4)


def test_batch_read_back_from_the_store_equals_the_collected_batch(tmp_store, tiny_policy, smoke_config):
    from workers.coordinator.rollout import iteration_requests, load_batch, publish_batch
    from workers.explore.seed_plan import default_seed_plan, load_seed_plan, publish_seed_plan

    publish_seed_plan(tmp_store, "demo", default_seed_plan(smoke_config, 2))
    plan = load_seed_plan(tmp_store, "demo", 2)
    requests = iteration_requests(smoke_config, "demo", 2, weights_version=2, plan=plan)
    batch = GRPOTrainer(tiny_policy, smoke_config).collect(2, seeds=plan.flat_seeds())
    assert publish_batch(tmp_store, "demo", 2, requests, batch, "trainer") == len(requests)
    assert publish_batch(tmp_store, "demo", 2, requests, batch, "trainer") == 0  # a re-run commits nothing new
    loaded = load_batch(tmp_store, "demo", smoke_config, 2, requests)
    assert torch.equal(loaded.rewards, batch.rewards)
    assert torch.equal(loaded.advantages, batch.advantages)
    assert torch.equal(loaded.trajectory.latents, batch.trajectory.latents)
    assert torch.allclose(loaded.trajectory.log_probs, batch.trajectory.log_probs, equal_nan=True)


def test_a_wider_draw_in_the_pipeline_trains_on_what_spotlight_train_keeps(
    tmp_store, tiny_policy, smoke_config, tmp_path
):
    from workers.coordinator.rollout import collect_in_process, iteration_requests, load_batch
    from workers.explore.seed_plan import default_seed_plan
    from workers.trainer.checkpoint import save_checkpoint

    torch.set_num_threads(1)
    wide = dataclasses.replace(smoke_config, rollouts_per_prompt=7)
    save_checkpoint(tmp_store, "demo", 2, tiny_policy, GRPOTrainer(tiny_policy, wide).optimizer)
    requests = iteration_requests(wide, "demo", 2, weights_version=2, plan=default_seed_plan(wide, 2))
    assert len(requests) == wide.prompts_per_iteration * 7  # every drawn sample is a request, and is committed
    assert collect_in_process(tmp_store, "demo", wide, 2, requests) == len(requests)
    loaded = load_batch(tmp_store, "demo", wide, 2, requests)
    direct = GRPOTrainer(tiny_policy, wide).collect(2)
    assert loaded.trajectory.seeds == direct.trajectory.seeds and len(direct.trajectory.seeds) == 2 * 4
    assert torch.equal(loaded.rewards, direct.rewards) and torch.equal(loaded.advantages, direct.advantages)
    assert torch.equal(loaded.drawn_rewards, direct.drawn_rewards)


def test_seed_plan_of_another_preset_is_refused(tmp_store, smoke_config):
    from workers.explore.seed_plan import default_seed_plan

    plan = default_seed_plan(smoke_config, 1)
    with pytest.raises(ValueError, match="does not match"):
        plan.check_matches(dataclasses.replace(smoke_config, group_size=3))


def test_published_versions_reach_the_trainers_hash(tmp_store, tiny_policy, smoke_config, tmp_path):
    from workers.coordinator.sync import publish_version
    from workers.trainer.checkpoint import load_checkpoint, save_checkpoint

    base = publish_version(tmp_store, "demo", 0, anchor_every=2, base=_tiny_folder(tiny_policy, tmp_path))
    assert base.kind == "anchor" and base.reproduced
    policy, _ = load_checkpoint(tmp_store, "demo", 0)
    trainer = GRPOTrainer(policy, smoke_config)
    for version in (1, 2, 3):
        trainer.update(trainer.collect(version - 1))
        save_checkpoint(tmp_store, "demo", version, policy, trainer.optimizer)
        outcome = publish_version(tmp_store, "demo", version, anchor_every=2)
        assert outcome.kind == "patch" and outcome.reproduced
        assert outcome.sent_bytes < outcome.dense_bytes
        assert outcome.anchored == (version == 2)
