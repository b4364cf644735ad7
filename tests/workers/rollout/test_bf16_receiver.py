"""A rollout worker's resident weights: BF16 parameters patched in place (resident_dtype "bf16") or FP32 parameters
fed from a BF16 dict ("fp32"); either reaches the sender's hash from the nearest anchor plus a few patches."""

from __future__ import annotations

import pytest
import torch

from resources.keys import anchor_key, patch_key
from tests.workers.pulse.counting_store import CountingStore
from workers.algo.sampler import SamplerConfig, rollout
from workers.pulse import weights_hash
from workers.rollout.weights import PolicyHolder, publish_policy, resolve_resident_dtype

PROMPTS = ["a red circle", "two blue squares"]


def _publish_chain(store, policy, num_versions: int, anchor_every: int) -> dict[int, str]:
    """Versions 0..num_versions of `policy` under small updates; version -> the sender's weights hash."""
    publisher = publish_policy(store, "demo", policy, anchor_every=anchor_every)
    hashes = {0: weights_hash(publisher.last_state)}
    gen = torch.Generator().manual_seed(0)
    for version in range(1, num_versions + 1):
        with torch.no_grad():
            for param in policy.parameters():
                param.add_(2e-3 * torch.randn(param.shape, generator=gen))
        publisher.publish(version, policy.weights())
        hashes[version] = weights_hash(publisher.last_state)
    return hashes


def _bytes_held(holder: PolicyHolder) -> int:
    """Bytes of every distinct tensor storage the holder keeps: the policy's parameters and the dict PULSE patches."""
    tensors = [*holder.policy.parameters(), *holder._weights.values()]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


@pytest.mark.parametrize("resident_dtype", ["bf16", "fp32"])
def test_a_fresh_worker_at_version_23_loads_anchor_20_and_applies_three_patches(tmp_path, tiny_policy, resident_dtype):
    store = CountingStore(tmp_path / "store")
    hashes = _publish_chain(store, tiny_policy, 23, anchor_every=10)
    store.reads.clear()
    holder = PolicyHolder(store, resident_dtype=resident_dtype)
    policy = holder.policy_at("demo", 23)
    assert store.chain_reads() == {anchor_key("demo", 20): 1, **{patch_key("demo", v): 1 for v in (21, 22, 23)}}
    assert weights_hash(holder._weights) == hashes[23]
    if resident_dtype == "bf16":
        assert weights_hash(policy.weights()) == hashes[23]  # the model's own parameters carry the sender's bits


def test_the_bf16_receiver_reaches_the_senders_hash_at_every_version_in_place(tmp_path, tiny_policy):
    store = CountingStore(tmp_path / "store")
    hashes = _publish_chain(store, tiny_policy, 12, anchor_every=5)
    holder = PolicyHolder(store, resident_dtype="bf16")
    policy = holder.policy_at("demo", 0)
    storage = {name: p.data_ptr() for name, p in policy.named_parameters()}
    for version in range(0, 13):
        store.reads.clear()
        assert holder.policy_at("demo", version) is policy
        assert weights_hash(policy.weights()) == hashes[version], version
        assert {name: p.data_ptr() for name, p in policy.named_parameters()} == storage  # patched, not reallocated
        if version:
            assert store.chain_reads() == {patch_key("demo", version): 1}  # one patch per version, no anchor


def test_nothing_holds_an_fp32_copy_in_bf16_mode(tmp_path, tiny_policy):
    store = CountingStore(tmp_path / "store")
    _publish_chain(store, tiny_policy, 3, anchor_every=10)
    numel = sum(p.numel() for p in tiny_policy.parameters())
    bf16 = PolicyHolder(store, resident_dtype="bf16")
    policy = bf16.policy_at("demo", 3)
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    assert {t.dtype for t in policy.state_dict().values()} == {torch.bfloat16}
    assert _bytes_held(bf16) == 2 * numel  # the patched dict is a view of the parameters: nothing else is held
    fp32 = PolicyHolder(store, resident_dtype="fp32")
    fp32.policy_at("demo", 3)
    assert _bytes_held(fp32) == 6 * numel  # FP32 parameters plus the BF16 dict they are copied from


def test_bf16_weights_sample_what_fp32_weights_sample_under_bf16_autocast(tmp_path, tiny_policy):
    """The BF16 receiver's samples equal the FP32 receiver's (same request, BF16 forwards) to a stated tolerance:
    matmuls see the same BF16 values either way; norms and additions of weights round once more in BF16."""
    store = CountingStore(tmp_path / "store")
    _publish_chain(store, tiny_policy, 2, anchor_every=10)
    sampler = SamplerConfig(num_steps=8, noise_level=0.7, forward_dtype="bf16")
    runs = [
        rollout(PolicyHolder(store, resident_dtype=d).policy_at("demo", 2), PROMPTS, [3, 4], sampler)
        for d in ("bf16", "fp32")
    ]
    images_diff = float((runs[0].images - runs[1].images).abs().max())
    assert 0 < images_diff < 0.02  # images in [-1, 1]; 0: the two paths would not differ at all
    torch.testing.assert_close(runs[0].log_probs, runs[1].log_probs, atol=1e-4, rtol=0)


def test_a_bf16_worker_refuses_a_request_for_fp32_forwards_before_loading_weights(tmp_path, tiny_policy):
    store = CountingStore(tmp_path / "store")
    _publish_chain(store, tiny_policy, 1, anchor_every=10)
    holder = PolicyHolder(store, resident_dtype="bf16")
    with pytest.raises(ValueError, match="--resident-dtype fp32"):
        holder.check_forward(SamplerConfig(forward_dtype="fp32"))
    assert holder.policy is None
    holder.check_forward(SamplerConfig(forward_dtype="bf16"))
    PolicyHolder(store, resident_dtype="fp32").check_forward(SamplerConfig(forward_dtype="fp32"))


def test_auto_keeps_bf16_weights_on_cuda_and_fp32_on_the_cpu():
    assert resolve_resident_dtype("auto", torch.device("cuda", 0)) == "bf16"
    assert resolve_resident_dtype("auto", torch.device("cpu")) == "fp32"
    assert resolve_resident_dtype("fp32", torch.device("cuda", 0)) == "fp32"
    with pytest.raises(ValueError, match="resident_dtype"):
        resolve_resident_dtype("fp16", torch.device("cpu"))


def test_a_merged_sync_bf16_receiver_builds_no_fp32_transformer(tmp_path):
    """The 20B case in small: a merged-sync worker's plain transformer is built on the meta device and its
    parameters are the chain's BF16 tensors, which reach the trainer's merged hash; its velocity under BF16
    autocast equals the FP32 receiver's to BF16 rounding."""
    from resources.store import open_store
    from workers.coordinator.sync import publish_version
    from workers.model.families.tiny import build_tiny_pipeline
    from workers.trainer.checkpoint import load_checkpoint, save_checkpoint

    folder = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    store, model = open_store(str(tmp_path / "store")), {"resolution": 32, "lora_rank": 4, "sync_mode": "merged"}
    publish_version(store, "merged", 0, base=folder, model=model)
    trained, _ = load_checkpoint(store, "merged", 0)
    with torch.no_grad():
        for param in trained.trainable_parameters():
            param.add_(0.05 * torch.randn_like(param))
    save_checkpoint(store, "merged", 1, trained)
    outcome = publish_version(store, "merged", 1, model=model)
    bf16 = PolicyHolder(store, resident_dtype="bf16").policy_at("merged", 1)
    fp32 = PolicyHolder(store, resident_dtype="fp32").policy_at("merged", 1)
    assert not bf16.is_lora and {p.dtype for p in bf16.transformer.parameters()} == {torch.bfloat16}
    assert weights_hash(bf16.weights()) == outcome.trainer_hash
    x, sigma = torch.randn(2, *bf16.latent_shape, generator=torch.Generator().manual_seed(0)), torch.tensor([0.4, 0.8])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        cond = fp32.encode_prompts(PROMPTS)
        v_bf16, v_fp32 = bf16.velocity(x, sigma, *cond).float(), fp32.velocity(x, sigma, *cond).float()
    assert float((v_bf16 - v_fp32).abs().max()) <= 0.02 * float(v_fp32.abs().max())


def test_the_worker_flag_sets_how_its_holder_keeps_the_weights(tmp_path, tmp_store):
    import dataclasses
    import threading

    from resources.queue import open_queue
    from workers.rollout.config import WorkerConfig
    from workers.rollout.loop import WorkerLoop
    from workers.rollout.worker import build_parser

    flags = ["--queue", str(tmp_path / "q.db"), "--store", str(tmp_path / "store"), "--worker-id", "w"]
    assert WorkerConfig.from_args(build_parser().parse_args(flags)).resident_dtype == "auto"
    config = WorkerConfig.from_args(build_parser().parse_args([*flags, "--resident-dtype", "bf16"]))
    loop = WorkerLoop(open_queue(tmp_path / "q.db"), tmp_store, config, threading.Event(), lambda *a, **k: None)
    assert loop.holder.resident_dtype == "bf16"
    with pytest.raises(ValueError, match="--resident-dtype"):
        dataclasses.replace(config, resident_dtype="fp16")


def test_a_lora_sync_bf16_receiver_holds_the_adapter_in_bf16_beside_its_base(tmp_path):
    """Under sync_mode "lora" the adapter is what syncs: its BF16 tensors become the adapter's parameters (the FP32
    ones built with it are dropped) and the base stays in its base_dtype; the hash and the velocity match."""
    from workers.model.families.diffusers_policy import load_model_policy
    from workers.model.families.lora import adapter_of
    from workers.model.families.tiny import build_tiny_pipeline

    policy = load_model_policy(build_tiny_pipeline("qwen-image", tmp_path / "qwen"), resolution=32, lora_rank=4)
    with torch.no_grad():
        for param in policy.trainable_parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())))
    store = CountingStore(tmp_path / "store")
    publisher = publish_policy(store, "lora", policy)
    bf16 = PolicyHolder(store, resident_dtype="bf16").policy_at("lora", 0)
    fp32 = PolicyHolder(store, resident_dtype="fp32").policy_at("lora", 0)
    dtypes = {name: p.dtype for name, p in bf16.transformer.named_parameters()}
    assert bf16.is_lora and {d for n, d in dtypes.items() if adapter_of(n)} == {torch.bfloat16}
    assert {d for n, d in dtypes.items() if not adapter_of(n)} == {torch.float32}  # the base: base_dtype fp32
    assert weights_hash(bf16.weights()) == weights_hash(publisher.last_state)
    x, sigma = torch.randn(2, *bf16.latent_shape, generator=torch.Generator().manual_seed(0)), torch.tensor([0.4, 0.8])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        cond = fp32.encode_prompts(PROMPTS)
        v_bf16, v_fp32 = bf16.velocity(x, sigma, *cond).float(), fp32.velocity(x, sigma, *cond).float()
    assert float((v_bf16 - v_fp32).abs().max()) <= 0.02 * float(v_fp32.abs().max())
