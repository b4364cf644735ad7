"""Text encoders out of every process's memory: every prompt of the run is encoded once, on the device, into the
store's prompt cache, then the encoders go.

A run's prompts are known before it starts: each iteration's training prompts are a pure function of (run seed,
iteration, the prompts file if any), the held-out prompts are fixed, and true CFG adds the negative prompt.
Qwen-Image's text encoder is about 16 GB; the embeddings of thousands of prompts are a few GB, on disk. So at the
base version the coordinator's process moves the encoders to the run's device, encodes every prompt of the run in
chunks, commits each chunk to the store (`prompt_store`), and drops the encoders. Every later phase on every
process (trainer ranks, rollout workers, exploration, validation) reads the store through its policy's prompt
source (`resident_checkpoint` and `PolicyHolder` attach it) and keeps at most MAX_HELD_PROMPTS in memory.

Example:
    cached = encode_run_prompts(ctx, policy)     # None: a policy without text encoders (the pixel policy)
"""

from __future__ import annotations

from workers.coordinator.context import RunContext
from workers.model.families.prompt_store import (
    StorePromptSource,
    attach_prompt_store,
    prompts_to_cache,
    publish_encoded,
)
from workers.task.prompt_file import negative_prompts, train_prompts
from workers.task.validation import resolve_validation

ENCODE_CHUNK = 256
"""Prompts encoded (and held in memory) between two commits to the store."""


def run_prompts(ctx: RunContext) -> list[str]:
    """Every distinct prompt the run trains, explores or validates on, in first-use order."""
    c = ctx.train
    training = [p for k in range(ctx.num_iterations + 1) for p in train_prompts(c, k)]  # a prompts file's too
    held_out = resolve_validation(ctx.validation, c.reward, model=ctx.model is not None).prompts
    negatives = negative_prompts(c.prompts).values()  # rows' own negative prompts (true CFG)
    return list(dict.fromkeys([*training, *held_out, *negatives]))


def encode_run_prompts(ctx: RunContext, policy) -> int | None:
    """Encode every prompt of the run (and the negative prompt) on `ctx.device` into the store's prompt cache, then
    drop `policy`'s text encoders; returns how many prompts the store holds for the run, or None (nothing done)
    for a policy without text encoders."""
    frozen = getattr(policy, "frozen", None)
    if frozen is None or not callable(getattr(policy, "drop_text_encoders", None)):
        return None
    spec = policy.model_spec
    prompts = prompts_to_cache(spec, run_prompts(ctx))
    source = StorePromptSource(ctx.store, ctx.run)
    missing = [p for p in prompts if not source.has(p, spec)]
    frozen.prompt_source = None  # encode here: never echo the store back into it
    if missing:  # the parts are shared per folder in this process: an earlier run here may have dropped the encoders
        frozen.text_encoders_dropped = False  # loaded again on first use, dropped again below
    frozen.to(ctx.device)  # the encoders run on the device (and the VAE loads there later)
    for start in range(0, len(missing), ENCODE_CHUNK):
        chunk = missing[start : start + ENCODE_CHUNK]
        publish_encoded(ctx.store, ctx.run, spec, policy.prompt_embeddings(chunk))
        frozen.forget_prompts()  # they are in the store now: host memory stays one chunk's worth
    policy.drop_text_encoders()
    attach_prompt_store(policy, ctx.store, ctx.run)
    return len(prompts)
