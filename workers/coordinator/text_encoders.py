"""Text encoders out of the trainer's memory: every prompt the run will use is encoded once, then the encoders go.

A run's prompts are known before it starts: each iteration's training prompts are a pure function of (run seed,
iteration, the prompts file if any), the held-out prompts are fixed, and true CFG adds the negative prompt.
Qwen-Image's text encoder is about 16 GB; its embeddings of a few hundred short prompts are megabytes. So at the
base version the coordinator's process encodes them all into the policy's prompt cache and drops the encoders;
every later phase (rollout, train, exploration, validation, the store's prompt cache for workers) reads the cache.
A run with more distinct prompts than MAX_CACHED_PROMPTS keeps its encoders.

Example:
    cached = encode_run_prompts(ctx, policy)     # None: too many prompts, the encoders stay
"""

from __future__ import annotations

from workers.coordinator.context import RunContext
from workers.model.families.prompt_store import prompts_to_cache
from workers.task.prompt_file import negative_prompts, train_prompts
from workers.task.validation import resolve_validation

MAX_CACHED_PROMPTS = 4096
"""Above this many distinct prompts the run keeps its text encoders (the cache would outgrow them)."""


def run_prompts(ctx: RunContext) -> list[str]:
    """Every distinct prompt the run trains, explores or validates on, in first-use order."""
    c = ctx.train
    training = [p for k in range(ctx.num_iterations + 1) for p in train_prompts(c, k)]  # a prompts file's too
    held_out = resolve_validation(ctx.validation, c.reward, model=ctx.model is not None).prompts
    negatives = negative_prompts(c.prompts).values()  # rows' own negative prompts (true CFG)
    return list(dict.fromkeys([*training, *held_out, *negatives]))


def encode_run_prompts(ctx: RunContext, policy) -> int | None:
    """Encode every prompt of the run (and the negative prompt) into `policy`'s prompt cache, then drop its text
    encoders; returns how many prompts were cached, or None (nothing done) for a policy without text encoders or
    a run of more than MAX_CACHED_PROMPTS prompts."""
    if not callable(getattr(policy, "drop_text_encoders", None)):
        return None

    prompts = prompts_to_cache(policy.model_spec, run_prompts(ctx))
    if len(prompts) > MAX_CACHED_PROMPTS:
        return None
    policy.prompt_embeddings(prompts)
    policy.drop_text_encoders()
    return len(prompts)
