"""Text encoders at the base version (workers/coordinator/text_encoders.py): every prompt of the run goes to the
store's prompt cache, however many there are, the encoders are dropped, and a process that builds the policy later
(another trainer rank, a later phase) reads the embeddings from the store without loading a text encoder."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from resources.store.local import LocalTensorStore
from workers.coordinator import text_encoders
from workers.model.families import diffusers_policy
from workers.trainer import resident

RUN = "demo"
PROMPTS = [f"{n} red circles above a blue square" for n in range(7)]


@pytest.fixture()
def encoded(tmp_path, monkeypatch):
    """(store, the coordinator's policy after encode_run_prompts, how many it cached, the reference embeddings)."""
    from workers.model.families.diffusers_policy import load_model_policy
    from workers.model.families.tiny import build_tiny_pipeline
    from workers.trainer.checkpoint import save_checkpoint

    folder = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    store = LocalTensorStore(str(tmp_path / "store"))
    policy = load_model_policy(folder, lora_rank=4, resolution=32)
    save_checkpoint(store, RUN, 0, policy)
    reference = {p: {k: v.clone() for k, v in e.items()} for p, e in policy.prompt_embeddings(PROMPTS).items()}
    diffusers_policy._SHARED.clear()  # the coordinator starts fresh: nothing cached in this process
    policy = load_model_policy(folder, lora_rank=4, resolution=32)
    monkeypatch.setattr(text_encoders, "run_prompts", lambda ctx: PROMPTS)
    monkeypatch.setattr(text_encoders, "ENCODE_CHUNK", 3)  # three commits, as thousands of prompts would make
    ctx = SimpleNamespace(store=store, run=RUN, device="cpu")
    cached = text_encoders.encode_run_prompts(ctx, policy)
    yield store, policy, cached, reference
    resident.release_resident()
    diffusers_policy._SHARED.clear()


def test_every_prompt_is_in_the_store_and_the_encoders_are_dropped(encoded):
    from workers.model.families.prompt_store import StorePromptSource

    store, policy, cached, _ = encoded
    assert cached == len(PROMPTS) + 1  # and true CFG's negative prompt
    assert policy.frozen.text_encoders_dropped and policy.frozen._text_pipe is None
    assert policy.frozen.prompt_cache == {}, "the embeddings live in the store, not in this process"
    source = StorePromptSource(store, RUN)
    assert all(source.has(p, policy.model_spec) for p in [*PROMPTS, " "])


def test_a_policy_built_later_reads_the_store_and_never_loads_a_text_encoder(encoded, monkeypatch):
    store, _, _, reference = encoded
    diffusers_policy._SHARED.clear()  # as another rank's process: no frozen parts yet
    resident.release_resident()
    monkeypatch.setattr(diffusers_policy, "MAX_HELD_PROMPTS", 2)
    policy, _ = resident.resident_checkpoint(store, RUN, 0)
    for prompt in PROMPTS:  # one at a time, as a sampler's chunks ask
        got = policy.prompt_embeddings([prompt])[prompt]
        torch.testing.assert_close(got, reference[prompt], atol=0, rtol=0)
        assert len(policy.frozen.prompt_cache) <= 2  # held in memory: bounded, the store has the rest
    assert "text_encoders" not in policy.frozen.loaded


def test_a_rows_negative_prompt_is_encoded_before_the_drop_and_read_from_the_store_by_another_rank(tmp_path):
    """43b's row negatives meet the store: the run's own prompt list (not a stub) carries each row's negative
    prompt, so a rank that never loads the encoders builds that row's true-CFG pass from the store."""
    import json

    from workers.algo.sampler import SamplerConfig
    from workers.model.families.diffusers_policy import load_model_policy
    from workers.model.families.tiny import build_tiny_pipeline
    from workers.task.prompt_file import PromptSource
    from workers.task.validation import ValidationConfig
    from workers.trainer.checkpoint import save_checkpoint
    from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig

    rows = tmp_path / "prompts.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps(r) for r in [{"prompt": "a cat", "negative_prompt": "blurry, low quality"}, {"prompt": "a dog"}]
        )
    )
    train = TrainConfig(
        iterations=1,
        prompts_per_iteration=2,
        group_size=2,
        reward="jpeg_compressibility",
        prompts=PromptSource.from_file(rows),
        sampler=SamplerConfig(num_steps=2),
    )
    folder = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    store = LocalTensorStore(str(tmp_path / "store"))
    try:
        policy = load_model_policy(folder, lora_rank=4, resolution=32, guidance=4.5)
        save_checkpoint(store, RUN, 0, policy)
        ctx = SimpleNamespace(
            store=store,
            run=RUN,
            device="cpu",
            train=train,
            num_iterations=1,
            validation=ValidationConfig(prompts=("a bird",)),
            model=str(folder),
        )
        assert "blurry, low quality" in text_encoders.run_prompts(ctx)
        text_encoders.encode_run_prompts(ctx, policy)
        diffusers_policy._SHARED.clear()  # as another rank's process
        resident.release_resident()
        other, _ = resident.resident_checkpoint(store, RUN, 0)
        GRPOTrainer(other, train)  # gives the policy the rows' negative prompts, as every train phase does
        conditioning, _ = other.encode_prompts(["a cat", "a dog"])
        assert conditioning.uncond is not None
        assert "text_encoders" not in other.frozen.loaded
        assert "blurry, low quality" in other.frozen.prompt_cache
    finally:
        resident.release_resident()
        diffusers_policy._SHARED.clear()
