"""Sampling and decoding in chunks, and the update's micro-batches: peak memory set by a chunk, not the iteration.

A chunk of `rollout_batch` requests is sampled, its final latents decoded by the VAE and turned into uint8
images before the next chunk starts; the trajectories (what the update trains on) come back to the CPU and
are joined. Requests are independent (each seed fixes its own noise), so chunked sampling gives the one-shot
result up to the kernels' rounding for another batch size.

Example:
    traj, images_NHW3 = sample_in_chunks(policy, prompts, seeds, sampler, chunk=8)
    for part, share in micro_parts(slice(0, 32), 32, micro_batch=8): ...   # 4 parts of share 0.25
"""

from __future__ import annotations

import numpy as np
import torch

from workers.algo.sampler import SamplerConfig, Trajectory, rollout
from workers.task.prompt_file import PromptSource, prompt_fields
from workers.task.render import decode_images
from workers.task.rewards import RewardFn, score_with_components


def sample_in_chunks(
    policy,
    prompts: list[str],
    seeds: list[int],
    sampler: SamplerConfig,
    chunk: int | None,
    init_seeds: list[int] | None = None,
) -> tuple[Trajectory, np.ndarray]:
    """(the trajectory of every request, their uint8 images (N, H, W, 3)), sampled and decoded `chunk` requests
    at a time (None: all at once). init_seeds: each request's initial-noise seed (`rollout`; None: its seed)."""
    if chunk is None or chunk >= len(prompts):
        traj = rollout(policy, prompts, seeds, sampler, init_seeds=init_seeds)
        return traj, decode_images(policy, traj.images)
    trajs, images = [], []
    for start in range(0, len(prompts), chunk):
        part_init = None if init_seeds is None else init_seeds[start : start + chunk]
        part = rollout(
            policy, prompts[start : start + chunk], seeds[start : start + chunk], sampler, init_seeds=part_init
        )
        images.append(decode_images(policy, part.images))
        trajs.append(part)
    return join_trajectories(trajs), np.concatenate(images)


def sample_scored(
    policy,
    reward_fn: RewardFn,
    prompts: list[str],
    seeds: list[int],
    sampler: SamplerConfig,
    chunk: int | None,
    source: PromptSource | None = None,
    init_seeds: list[int] | None = None,
) -> tuple[Trajectory, np.ndarray, torch.Tensor, dict[str, np.ndarray]]:
    """`sample_in_chunks` of the requests (prompt n with seed n), then their rewards: (trajectory, uint8 images,
    (N,) float32 rewards, each reward component's (N,) values or {}). `source`: the prompts file whose other
    columns the reward may read (None: MiniGenEval's prompts)."""
    policy.eval()
    traj, images = sample_in_chunks(policy, prompts, seeds, sampler, chunk, init_seeds)
    fields = None if source is None else [prompt_fields(source, p) for p in prompts]
    scores, components = score_with_components(reward_fn, images, prompts, fields)
    return traj, images, torch.as_tensor(scores, dtype=torch.float32), components


def join_trajectories(parts: list[Trajectory]) -> Trajectory:
    """One trajectory of the parts' requests, in order (every part walked the same steps)."""
    steps = {p.step for p in parts}
    assert len(steps) == 1, f"parts stopped at different steps {sorted(steps)}"
    return Trajectory(
        [q for p in parts for q in p.prompts],
        [s for p in parts for s in p.seeds],
        torch.cat([p.latents for p in parts], dim=1),
        torch.cat([p.log_probs for p in parts], dim=1),
        parts[0].step,
    )


def micro_parts(
    part: slice, minibatch_size: int, micro_batch: int | None, count: int | None = None
) -> list[tuple[slice, float]]:
    """`part` (this rank's positions in a minibatch of `minibatch_size`) cut into micro-batches of at most
    `micro_batch` positions, each with its share of the whole minibatch (the weight of its mean loss).

    `count`: pad to this many micro-batches by repeating the last one with share 0. Under FSDP every forward and
    backward is a collective, so every rank must run as many micro-batches as the rank with the largest part; a
    zero-share repeat joins the collectives and adds nothing to the gradient or the stats."""
    start, stop, _ = part.indices(minibatch_size)
    size = micro_batch or max(stop - start, 1)
    parts = [
        (slice(a, min(a + size, stop)), (min(a + size, stop) - a) / minibatch_size) for a in range(start, stop, size)
    ]
    if count is not None and count > len(parts):
        if not parts:
            raise ValueError(f"an empty part of a {minibatch_size}-sample minibatch cannot be padded")
        parts += [(parts[-1][0], 0.0)] * (count - len(parts))
    return parts
