"""Prompt embeddings cached in the tensor store: encoded once by the coordinator, read by workers that then never
load the text encoder(s); a worker falls back to encoding when they are missing or were made differently."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from resources.keys import prompt_embeddings_key, rollout_key
from resources.queue import open_queue
from tests.paths import REPO_ROOT
from workers.algo.sampler import SamplerConfig
from workers.model.families import diffusers_policy as family_policy
from workers.model.families.diffusers_policy import load_model_policy
from workers.model.families.prompt_store import (
    attach_prompt_store,
    publish_prompt_embeddings,
    publish_run_prompt_embeddings,
)
from workers.rollout.state import RolloutSpec, rollout_request
from workers.rollout.weights import publish_policy

FAMILIES = ("qwen-image", "sd3", "flux")
PROMPTS = ["two red circles", "a blue square above a green triangle"]


def _fresh_process_policy(path, **fields):
    """A policy with frozen parts of its own, as a new worker process would build it."""
    family_policy._SHARED.clear()
    return load_model_policy(path, **fields)


def _assert_same_conditioning(a, b) -> None:
    for part in ("cond", "uncond"):
        x, y = getattr(a, part), getattr(b, part)
        assert (x is None) == (y is None)
        if x is not None:
            assert sorted(x) == sorted(y) and all(torch.equal(x[k], y[k]) for k in x), part


@pytest.mark.parametrize("family", FAMILIES)
def test_a_worker_reads_the_coordinators_embeddings_bit_identically_without_loading_a_text_encoder(
    pipelines, tmp_store, family
):
    coordinator = _fresh_process_policy(pipelines[family], resolution=32, guidance=4.0)
    out = publish_prompt_embeddings(tmp_store, "demo", coordinator.model_spec, PROMPTS)
    assert out.num_written == len(PROMPTS) + (family != "flux")  # true CFG (Qwen-Image, SD3): the negative prompt too
    assert publish_prompt_embeddings(tmp_store, "demo", coordinator.model_spec, PROMPTS).num_written == 0  # once
    own, _ = coordinator.encode_prompts(PROMPTS)

    worker = _fresh_process_policy(pipelines[family], resolution=32, guidance=4.0)
    attach_prompt_store(worker, tmp_store, "demo")
    cached, _ = worker.encode_prompts(PROMPTS)
    _assert_same_conditioning(cached, own)
    if family != "qwen-image":  # SD3 and FLUX.1 carry the pooled CLIP embedding too
        assert "pooled_projections" in cached.cond
    worker.decode(torch.randn(1, *worker.latent_shape))
    assert worker.frozen.loaded == ["vae"] and worker.frozen.prompt_source.num_read == out.num_prompts


def test_a_worker_encodes_itself_when_the_store_lacks_the_prompt_or_holds_other_encoder_settings(pipelines, tmp_store):
    path = pipelines["sd3"]
    coordinator = _fresh_process_policy(path, resolution=32, max_sequence_length=8)
    publish_prompt_embeddings(tmp_store, "demo", coordinator.model_spec, PROMPTS[:1])
    worker = _fresh_process_policy(path, resolution=32)  # max_sequence_length 512: the cached ones do not fit
    attach_prompt_store(worker, tmp_store, "demo")
    cached, _ = worker.encode_prompts(PROMPTS)
    own, _ = _fresh_process_policy(path, resolution=32).encode_prompts(PROMPTS)
    _assert_same_conditioning(cached, own)
    assert worker.frozen.loaded == ["text_encoders"] and worker.frozen.prompt_source.num_read == 0


def test_a_malformed_cache_entry_is_refused_with_a_message_naming_its_key(pipelines, tmp_store):
    worker = _fresh_process_policy(pipelines["qwen-image"], resolution=32)
    key = prompt_embeddings_key("demo", PROMPTS[0])
    meta = {
        "format": "spotlight-prompt-embeddings/1",
        "prompt": PROMPTS[0],
        "family": "qwen-image",
        "max_sequence_length": 512,
        "base_dtype": "fp32",
    }
    tmp_store.publish_tensors(key, {"prompt_embeds": torch.zeros(3, 16, dtype=torch.float16)}, meta)
    attach_prompt_store(worker, tmp_store, "demo")
    with pytest.raises(ValueError, match=key):
        worker.encode_prompts(PROMPTS[:1])


def test_the_runs_spec_comes_from_its_anchor_and_a_pixel_run_caches_nothing(pipelines, tmp_store, tiny_policy):
    publish_policy(tmp_store, "pixel", tiny_policy)
    assert publish_run_prompt_embeddings(tmp_store, "pixel", PROMPTS) is None
    assert publish_run_prompt_embeddings(tmp_store, "nothing-yet", PROMPTS) is None
    publish_policy(tmp_store, "demo", _fresh_process_policy(pipelines["flux"], resolution=32, lora_rank=2))
    out = publish_run_prompt_embeddings(tmp_store, "demo", PROMPTS)
    assert out.num_written == 2 and out.size_bytes > 0
    assert tmp_store.read_manifest(prompt_embeddings_key("demo", PROMPTS[1])).metadata["prompt"] == PROMPTS[1]


# --- in worker processes --------------------------------------------------------------------------------------

WORKER = """
import gc, json, sys
from transformers import PreTrainedModel
from workers.model.families import diffusers_policy as policy
from workers.rollout.worker import main

code = main(sys.argv[1:])
gc.collect()
frozen = list(policy._SHARED.values())
text_models = sorted({type(o).__name__ for o in gc.get_objects() if isinstance(o, PreTrainedModel)})
print(json.dumps({"event": "report", "code": code, "loaded": frozen[0].loaded, "text_models": text_models}))
"""


def _worker_process(tmp_path, store, worker_id: str) -> dict:
    command = [
        sys.executable,
        "-c",
        WORKER,
        "--queue",
        str(tmp_path / "queue.db"),
        "--store",
        str(store.root),
        "--worker-id",
        worker_id,
        "--threads",
        "1",
        "--max-idle-s",
        "0.2",
    ]
    done = subprocess.run(
        command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert any(e["event"] == "acked" for e in events), done.stdout[-3000:]
    return events[-1]


def test_a_worker_process_fed_from_the_store_samples_bit_identically_and_never_builds_a_text_encoder(
    pipelines, tmp_store, tmp_path
):
    policy = _fresh_process_policy(pipelines["qwen-image"], resolution=32, lora_rank=4, guidance=4.0)
    with torch.no_grad():  # off the LoRA's init, so the transformer's output depends on the adapter
        for p in policy.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    publish_policy(tmp_store, "demo", policy)
    spec = RolloutSpec(
        "demo", PROMPTS[0], 5, 0, SamplerConfig(num_steps=3, forward_dtype="fp32"), "jpeg_compressibility"
    )
    queue = open_queue(tmp_path / "queue.db")
    queue.put([rollout_request("encodes", 0, spec)])
    itself = _worker_process(tmp_path, tmp_store, "w-encodes")
    assert "text_encoders" in itself["loaded"] and itself["text_models"]  # control: no cache, so it encoded

    publish_run_prompt_embeddings(tmp_store, "demo", [PROMPTS[0]])  # the coordinator's sync phase does this
    queue.put([rollout_request("cached", 0, spec)])
    cached = _worker_process(tmp_path, tmp_store, "w-cached")
    assert cached["loaded"] == ["vae"] and cached["text_models"] == []
    a, b = (tmp_store.load_tensors(rollout_key("demo", 0, rid)) for rid in ("encodes", "cached"))
    assert torch.equal(a["latents"], b["latents"]) and torch.equal(a["log_probs"], b["log_probs"])
    assert not torch.isnan(a["latents"]).any()
