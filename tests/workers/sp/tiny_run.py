"""A tiny Qwen-Image run for the SP tests, and the rollout worker's results for it (the reference)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from workers.algo.sampler import SamplerConfig

SAMPLER = SamplerConfig(num_steps=4, noise_level=0.7, forward_dtype="fp32")
PROMPTS = ("two red circles", "a blue square")
RUN = "t"


@dataclass
class TinyRun:
    model: Path
    """The tiny Qwen-Image folder (4 heads, so groups of 2 and 4 split it)."""
    requests: list[dict]
    """Queue requests of the run (rollout kind), in order."""


def tiny_run(model: Path, stores: list, num_requests: int) -> TinyRun:
    """Publish one LoRA policy (true CFG 3, 32 px: 16 image tokens) and its prompts' embeddings to every store."""
    from workers.model.families.diffusers_policy import load_model_policy
    from workers.model.families.prompt_store import publish_run_prompt_embeddings
    from workers.rollout.state import RolloutSpec, rollout_request
    from workers.rollout.weights import publish_policy

    policy = load_model_policy(model, resolution=32, lora_rank=2, guidance=3.0)
    with torch.no_grad():  # a LoRA that moved, so the adapter is part of what the group computes
        for p in policy.trainable_parameters():
            p.copy_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    for store in stores:
        publish_policy(store, RUN, policy)
        publish_run_prompt_embeddings(store, RUN, PROMPTS)
    specs = [RolloutSpec(RUN, PROMPTS[i % 2], 10 + i, 0, SAMPLER, "jpeg_compressibility") for i in range(num_requests)]
    return TinyRun(model, [rollout_request(f"r{i}", 0, spec) for i, spec in enumerate(specs)])


def rollout_worker_results(store, requests: list[dict]) -> dict[str, str]:
    """Request id -> result key, each sampled by the rollout worker's own code in this process, with the torch
    thread count of a node's device workers (a rollout worker started with `--threads` of that count).

    The thread count is part of the kernel set (docs/SPOT_RUNTIME.md): BLAS splits a matrix product by it, and on
    some CPUs (measured: AMD EPYC, MKL sgemm of 5 to 9 rows, such as the CFG pass's text tokens) two counts round
    differently, so a reference with the session's threads would not be the worker a group of one must equal."""
    from resources.queue.records import Request
    from workers.rollout.request import work_request
    from workers.rollout.weights import PolicyHolder
    from workers.sp.node_agent import AgentConfig

    holder = PolicyHolder(store)
    keys = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(AgentConfig(store_url=store.url).threads_per_worker)
    try:
        for body in requests:
            outcome = work_request(Request.from_dict(body), 1, store, holder, worker_id="plain", commit_every=2)
            assert outcome.status == "done"
            keys[body["request_id"]] = outcome.result_key
    finally:
        torch.set_num_threads(threads)
    return keys
