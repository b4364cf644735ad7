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
    first_minibatch_ratio(trainer, batch)   # {"rollout_vs_train": ..., "recomputed": 0.0}: the figure to report
"""

from __future__ import annotations

import dataclasses

import torch

from workers.algo.sampler import SamplerConfig, step_log_prob
from workers.algo.seeds import domain_seed


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


def first_minibatch_ratio(trainer, batch) -> dict[str, float]:
    """How far the PPO ratio of the update's first minibatch is from 1 before any step, as max |ratio - 1| over its
    samples and SDE steps: against the rollout's own log-probs (`rollout_vs_train`: sampling and training disagree by
    batch layout, kernels and, on queue workers, BF16 weights) and against the recomputed ones the train phase uses
    (`recomputed`: 0 where the recompute runs the training forward's kernels). The policy is left in eval mode."""
    config = trainer.config
    gen = torch.Generator().manual_seed(domain_seed(config.seed, "minibatches", batch.iteration))
    chunks = first_epoch_minibatches(gen, batch.rewards.shape[0], config.grpo.num_minibatches)
    policy, sampler, traj = trainer.policy, config.sampler_at(batch.iteration), batch.trajectory
    policy.train()
    recomputed = with_policy_log_probs(policy, batch, sampler, chunks).trajectory.log_probs
    index = chunks[0]
    prompts = [traj.prompts[i] for i in index.tolist()]
    worst = {"rollout_vs_train": 0.0, "recomputed": 0.0}
    for t in sampler.sde_steps:
        emb, mask = policy.encode_prompts(prompts)
        lp, _, _ = step_log_prob(policy, traj.latents, t, emb, mask, sampler, index)  # with grad, as the update runs
        lp = lp.detach().float().cpu()
        for name, old in (("rollout_vs_train", traj.log_probs[t][index]), ("recomputed", recomputed[t][index])):
            worst[name] = max(worst[name], float((torch.exp(lp - old) - 1).abs().max()))
    policy.eval()
    return worst
