"""The LoRA on a diffusers transformer (workers/model/families/lora.py): where it starts."""

from __future__ import annotations

import torch

from workers.model.families.diffusers_policy import load_model_policy


def test_a_lora_starts_from_the_same_adapter_whatever_the_processs_random_state(pipelines):
    """Regression: lora_A was drawn from the global RNG, so `spotlight train --nproc 2` (whose rank 0 had drawn
    other numbers first) started from another adapter than `--nproc 1`, and their updates differed."""
    loaded = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        before = torch.random.get_rng_state()
        loaded.append(load_model_policy(pipelines["qwen-image"], resolution=32, lora_rank=4).weights())
        assert torch.equal(torch.random.get_rng_state(), before), "building the LoRA moved the caller's RNG"
    assert any(float(v.abs().sum()) > 0 for k, v in loaded[0].items() if "lora_A" in k)
    torch.testing.assert_close(loaded[0], loaded[1], atol=0, rtol=0)


def test_merged_sync_ships_the_merged_transformer_and_a_worker_runs_it_without_an_adapter(pipelines, tmp_path):
    from resources.store import open_store
    from workers.coordinator.sync import publish_version
    from workers.model.families.lora import merged_weights
    from workers.pulse import weights_hash
    from workers.rollout.weights import PolicyHolder
    from workers.trainer.checkpoint import load_checkpoint, save_checkpoint

    store, model = open_store(str(tmp_path / "store")), {"resolution": 32, "lora_rank": 4, "sync_mode": "merged"}
    first = publish_version(store, "merged", 0, base=pipelines["qwen-image"], model=model)
    trained, _ = load_checkpoint(store, "merged", 0)
    assert trained.is_lora, "the trainer's checkpoint keeps the adapter"
    with torch.no_grad():  # an update's worth of change to the adapter
        for param in trained.trainable_parameters():
            param.add_(0.05 * torch.randn_like(param))
    save_checkpoint(store, "merged", 1, trained)
    second = publish_version(store, "merged", 1, model=model)
    merged, targets = merged_weights(trained.transformer)
    assert first.reproduced and second.reproduced and second.kind == "patch"
    assert second.trainer_hash == weights_hash(merged)
    assert second.dense_bytes == sum(t.numel() * 2 for t in merged.values())  # the whole transformer in BF16

    worker = PolicyHolder(store).policy_at("merged", 1)  # a fresh worker: anchor 0, then the patch
    assert not worker.is_lora and not any(".lora_" in k for k in worker.transformer.state_dict())
    received = worker.weights()
    assert set(received) == set(merged) and targets
    assert all(torch.equal(received[k].to(torch.bfloat16), merged[k]) for k in merged)  # bit for bit
    x, sigma = torch.randn(2, *trained.latent_shape), torch.tensor([0.4, 0.8])
    with torch.no_grad():
        cond = trained.encode_prompts(["a red circle", "two blue squares"])
        v_trained, v_worker = trained.velocity(x, sigma, *cond), worker.velocity(x, sigma, *cond)
        v_base = load_checkpoint(store, "merged", 0)[0].velocity(x, sigma, *cond)
    # The worker runs what the trainer trained, to the BF16 rounding of the merged weights.
    assert float((v_worker - v_trained).abs().max()) < 0.2 * float((v_base - v_trained).abs().max())


def test_merged_sync_needs_a_lora(pipelines):
    import pytest

    with pytest.raises(ValueError, match="lora_rank > 0"):
        load_model_policy(pipelines["qwen-image"], resolution=32, lora_rank=0, sync_mode="merged")
    with pytest.raises(ValueError, match="sync_mode must be one of"):
        load_model_policy(pipelines["qwen-image"], resolution=32, lora_rank=4, sync_mode="fused")
