"""Under LoRA, NFT's v_old and the KL reference are adapter swaps on the trained transformer, not copies of it
(workers/trainer/frozen.py, workers/model/families/lora.py): the same updates, one base in memory."""

from __future__ import annotations

import copy

import pytest
import torch

from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.model.families.diffusers_policy import load_model_policy, save_model_policy
from workers.model.families.lora import AdapterView
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig


@pytest.fixture(scope="module")
def qwen_pipeline(tmp_path_factory):
    from workers.model.families.tiny import build_tiny_pipeline

    return build_tiny_pipeline("qwen-image", tmp_path_factory.mktemp("qwen") / "qwen")


def _config(objective: str) -> TrainConfig:
    # Two epochs: the second runs on weights that left v_old and the reference, so a wrong one shows.
    return TrainConfig(
        prompts_per_iteration=2,
        group_size=2,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=2, forward_dtype="fp32"),
        grpo=GRPOConfig(objective=objective, lr=1e-2, clip_range=10.0, num_minibatches=1, num_epochs=2, kl_beta=0.5),
    )


def _lora_policy(path):
    return load_model_policy(path, resolution=32, lora_rank=4)  # lora_A from a fixed seed: the same in both


def _train_two_iterations(trainer: GRPOTrainer) -> tuple[list[dict], dict[str, torch.Tensor]]:
    stats = [trainer.update(trainer.collect(k)) for k in range(2)]  # iteration 1 samples after v_old moved
    return stats, {k: v.clone() for k, v in trainer.policy.weights().items()}


@pytest.mark.parametrize("objective", ["nft", "flow_grpo"])
def test_adapter_swaps_update_a_lora_exactly_as_frozen_copies_do(qwen_pipeline, objective):
    swapped = GRPOTrainer(_lora_policy(qwen_pipeline), _config(objective))
    copied_policy = _lora_policy(qwen_pipeline)
    copied = GRPOTrainer(copied_policy, _config(objective))
    # The path before adapter swaps: v_old and the reference were deep copies of the whole policy.
    copied.sampling_policy = copy.deepcopy(copied_policy).requires_grad_(False) if objective == "nft" else None
    copied.reference = copy.deepcopy(copied_policy).requires_grad_(False)
    (swapped_stats, swapped_weights), (copied_stats, copied_weights) = map(_train_two_iterations, (swapped, copied))
    assert max(float(w.abs().max()) for k, w in swapped_weights.items() if "lora_B" in k) > 1e-3, "the LoRA never moved"
    assert all(s["kl"] > 0 for s in swapped_stats[1:]), "the KL term must be live for the comparison to mean anything"
    for mine, theirs in zip(swapped_stats, copied_stats, strict=False):
        assert {k: mine[k] for k in ("loss", "kl", "grad_norm")} == {k: theirs[k] for k in ("loss", "kl", "grad_norm")}
    torch.testing.assert_close(swapped_weights, copied_weights, atol=0, rtol=0)


def _base_tensors(policy) -> set[int]:
    """Storage addresses of the transformer's non-adapter parameters."""
    return {p.data_ptr() for name, p in policy.transformer.named_parameters() if ".lora_" not in name}


def test_under_lora_the_trainer_holds_one_base_transformer_and_checkpoints_only_the_trained_adapter(
    qwen_pipeline, tmp_path
):
    policy = _lora_policy(qwen_pipeline)
    trainer = GRPOTrainer(policy, _config("nft"))  # NFT with a KL term: v_old and a reference
    assert isinstance(trainer.sampling_policy, AdapterView) and isinstance(trainer.reference, AdapterView)
    assert len(policy.trainable_parameters()) == len(policy.weights()), "freezing the views froze the policy"
    held = [_base_tensors(p) for p in (trainer.policy, trainer.sampling_policy, trainer.reference)]
    assert held[0] == held[1] == held[2] and len(held[0]) > 0  # one base, three policies
    adapters = {
        name.split(".lora_")[1].split(".")[1] for name, _ in policy.transformer.named_parameters() if ".lora_" in name
    }
    assert adapters == {"default", "v_old"}
    assert all(".default." in k for k in policy.weights())  # checkpoints and PULSE carry the trained adapter only
    assert {id(p) for p in trainer.optimizer.param_groups[0]["params"]} == {
        id(p) for n, p in policy.transformer.named_parameters() if ".default." in n
    }
    save_model_policy(policy, tmp_path / "saved")
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "saved" / "lora" / "pytorch_lora_weights.safetensors"))
    assert len(saved) == len(policy.weights()) and not any("v_old" in k for k in saved)


def test_full_fine_tuning_still_keeps_frozen_copies(qwen_pipeline):
    policy = load_model_policy(qwen_pipeline, resolution=32, lora_rank=0)
    trainer = GRPOTrainer(policy, _config("nft"))
    held = [_base_tensors(p) for p in (trainer.policy, trainer.sampling_policy, trainer.reference)]
    assert not (held[0] & held[1]) and not (held[0] & held[2]) and not (held[1] & held[2])
    assert not any(p.requires_grad for p in trainer.reference.parameters())
