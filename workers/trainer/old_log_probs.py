"""Old log-probs for the PPO ratio, recomputed by the trainer before its first optimizer step.

A rollout's stored log-probs come from the weights that sampled it: on the queue path,
a worker's BF16-rounded copy of version k, one request at a time. The trainer's forward
runs on its FP32 masters over a minibatch, so even before any update the ratio
exp(log_prob - old_log_prob) is not 1, and with Flow-GRPO's clip range of 1e-4 part of the
first minibatch is clipped already. Recomputing the old log-probs with the trainer's own
forward (same weights, same minibatches, same step) makes the first minibatch's ratio
exactly 1 and leaves the ratio to measure only what the updates changed, as in PPO.

Example:
    chunks = first_epoch_minibatches(gen, n, num_minibatches)   # leaves `gen` where it was
    batch = with_policy_log_probs(policy, batch, sampler, chunks)
"""

from __future__ import annotations

import dataclasses

import torch

from workers.algo.sampler import SamplerConfig, step_log_prob


def first_epoch_minibatches(gen: torch.Generator, num_samples: int, num_minibatches: int) -> tuple[torch.Tensor, ...]:
    """The minibatches the update's first epoch will draw from `gen`, without advancing it."""
    state = gen.get_state()
    chunks = torch.randperm(num_samples, generator=gen).chunk(num_minibatches)
    gen.set_state(state)
    return chunks


def with_policy_log_probs(policy, batch, sampler: SamplerConfig, minibatches) -> object:
    """`batch` (a trainer `Rollouts`) with every SDE step's log-probs recomputed by `policy` in its
    current mode, minibatch by minibatch as the update will compute them; the rest is shared."""
    traj = batch.trajectory
    log_probs = traj.log_probs.clone()  # (num_steps, N)
    with torch.no_grad():
        for index in minibatches:
            prompts = [traj.prompts[i] for i in index.tolist()]
            for t in sampler.sde_steps:
                emb, mask = policy.encode_prompts(prompts)
                lp, _, _ = step_log_prob(policy, traj.latents, t, emb, mask, sampler, index)
                log_probs[t, index] = lp.float().cpu()
    return dataclasses.replace(batch, trajectory=dataclasses.replace(traj, log_probs=log_probs))
