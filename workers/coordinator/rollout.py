"""An iteration's rollout requests and their results in the store, as the trainer's `Rollouts` batch.

Both rollout paths leave the same thing behind: one committed result per request at
`rollout_key(run, k, request_id)` in the rollout worker's result format
(`workers/rollout/state.py`). Rollout workers write them one request at a time; the
in-process path (`GRPOTrainer.collect` on the trainer itself) writes a whole batch with
`publish_batch`. The train phase reads them back with `load_batch`, possibly in another
process.

Example:
    specs = iteration_requests(config, "demo", 3, weights_version=3, plan=plan)
    publish_batch(store, "demo", 3, specs, trainer.collect(3, seeds=plan.flat_seeds()))
    batch = load_batch(store, "demo", config, specs)          # Rollouts for trainer.update
"""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass

import torch

from resources.keys import (  # request_id: re-exported, the rollout phase names its requests
    batch_request_id,
    request_id,
    rollout_key,
)
from resources.ledger.records import RequestRecord, components_json
from resources.store.base import TensorStore
from workers.algo.sampler import Trajectory
from workers.explore.seed_plan import SeedPlan
from workers.rollout.state import InFlight, RolloutSpec, result_commit, result_components
from workers.task.prompt_file import negative_prompts, prompt_fields
from workers.task.prompt_row import set_row_negatives
from workers.task.render import to_uint8
from workers.task.rewards import get_reward
from workers.trainer.advantages import batch_advantages
from workers.trainer.chunks import sample_scored
from workers.trainer.grpo_trainer import Rollouts, TrainConfig, keep_max_variance
from workers.trainer.ranks import current_setup
from workers.trainer.resident import resident_checkpoint


@dataclass(frozen=True)
class PlannedRequest:
    """One rollout request of an iteration: its id, its place in the batch and what it samples."""

    request_id: str
    prompt_index: int
    sample_index: int
    spec: RolloutSpec


def iteration_requests(
    config: TrainConfig, run: str, iteration: int, weights_version: int, plan: SeedPlan
) -> list[PlannedRequest]:
    """The iteration's requests in batch order (prompt-major), seeds from the plan."""
    plan.check_matches(config)
    return [
        PlannedRequest(
            request_id(iteration, i, j),
            i,
            j,
            RolloutSpec(
                run,
                prompt,
                seed,
                weights_version,
                config.sampler_at(iteration),
                config.reward,
                prompt_fields=prompt_fields(config.prompts, prompt) or None,
                init_seed=config.group_init_seed(iteration, i),
            ),
        )
        for i, (prompt, seeds) in enumerate(zip(plan.prompts, plan.seeds, strict=False))
        for j, seed in enumerate(seeds)
    ]


def queue_batches(requests: list[PlannedRequest], seeds_per_request: int) -> list[tuple[str, RolloutSpec]]:
    """The queue requests that sample `requests`: (queue request id, spec). With seeds_per_request > 1, each
    prompt's samples are cut, in order, into batched requests of that many (`RolloutSpec.batched`; id
    `it3-p2-s0x8`), each committing one result per sample under the sample's own request id."""
    out: list[tuple[str, RolloutSpec]] = []
    for _, group in itertools.groupby(requests, key=lambda r: r.prompt_index):
        group = list(group)
        for chunk in (group[n : n + seeds_per_request] for n in range(0, len(group), seeds_per_request)):
            rid = chunk[0].request_id if len(chunk) == 1 else batch_request_id(chunk[0].request_id, len(chunk))
            out.append((rid, RolloutSpec.batched([r.spec for r in chunk], [r.request_id for r in chunk])))
    return out


def publish_batch(
    store: TensorStore, run: str, iteration: int, requests: list[PlannedRequest], batch: Rollouts, worker_id: str
) -> int:
    """Commit every request's result from an in-process batch; returns how many this call committed."""
    traj = batch.trajectory
    if traj.seeds != [r.spec.seed for r in requests]:
        raise ValueError("the batch was not sampled with these requests' seeds (order or plan differs)")
    images = batch.images if batch.images is not None else to_uint8(traj.images)
    won = 0
    for n, req in enumerate(requests):
        flight = InFlight(req.spec, traj.step, traj.latents[:, n : n + 1].clone(), traj.log_probs[:, n : n + 1].clone())
        info = {
            "worker_id": worker_id,
            "attempt": 1,
            "resumed_from_step": 0,
            "steps_done": traj.step,
            "compute_s": batch.rollout_s / len(requests),
            "finished_at": time.time(),
        }
        parts = {name: float(values[n]) for name, values in (batch.reward_components or {}).items()}
        tensors, meta = result_commit(
            flight, torch.from_numpy(images[n]), float(batch.rewards[n]), info, components=parts
        )
        won += store.publish_tensors(rollout_key(run, iteration, req.request_id), tensors, meta, exclusive=True).won
    return won


def load_results(
    store: TensorStore, run: str, iteration: int, requests: list[PlannedRequest]
) -> list[tuple[dict, dict]]:
    """(tensors, metadata) of every request's committed result, in batch order."""
    out = []
    for req in requests:
        key = rollout_key(run, iteration, req.request_id)
        manifest = store.read_manifest(key)
        if manifest is None:
            raise LookupError(f"request {req.request_id} of iteration {iteration} has no committed result at {key}")
        if manifest.metadata.get("fingerprint") != req.spec.fingerprint:
            raise ValueError(f"the result at {key} belongs to a different request (fingerprint mismatch)")
        out.append((store.load_tensors(key), dict(manifest.metadata)))
    return out


def load_batch(
    store: TensorStore, run: str, config: TrainConfig, iteration: int, requests: list[PlannedRequest]
) -> Rollouts:
    """The trainer's batch rebuilt from committed results (advantages recomputed per group). A prompt
    sampled wider than group_size (TrainConfig.rollouts_per_prompt) keeps its group_size samples of
    largest reward variance, as `spotlight train` does."""
    results = load_results(store, run, iteration, requests)
    latents = torch.stack([t["latents"] for t, _ in results], dim=1)  # (num_steps + 1, N, 3, H, W)
    log_probs = torch.stack([t["log_probs"] for t, _ in results], dim=1)  # (num_steps, N)
    traj = Trajectory(
        [r.spec.prompt for r in requests], [r.spec.seed for r in requests], latents, log_probs, config.sampler.num_steps
    )
    rewards = torch.tensor([m["reward"] for _, m in results], dtype=torch.float32)
    group_ids = torch.tensor([r.prompt_index for r in requests])
    rollout_s = sum(float(m.get("compute_s", 0.0)) for _, m in results)
    components = result_components([m for _, m in results])  # a multi-reward's parts: the train phase's reward/<name>
    advantages = batch_advantages(config.grpo, config.reward, rewards, group_ids, components)
    return keep_max_variance(
        Rollouts(iteration, traj, rewards, group_ids, advantages, rollout_s, reward_components=components),
        config.group_size,
        config.grpo,
        config.reward,
    )


@dataclass(frozen=True)
class RolloutOrder:
    """What rank 0 sends the other trainer ranks: sample your part of the iteration's requests into the store."""

    store_url: str
    run: str
    config: TrainConfig
    iteration: int
    requests: list[PlannedRequest]
    device: str


def collect_in_process(
    store: TensorStore,
    run: str,
    config: TrainConfig,
    iteration: int,
    requests: list[PlannedRequest],
    worker_id: str = "trainer",
    device: str = "cpu",
) -> int:
    """The rollout phase without workers: the trainer samples the batch at the iteration's weights
    version (its FP32 checkpoint, on the process's resident policy) and commits every result, sampling and
    decoding `config.rollout_batch` requests at a time; returns how many were committed.

    As rank 0 of N trainer ranks (workers/trainer/ranks.py) it orders every rank to sample its contiguous part of
    the requests (`sample_part`), as worker `{worker_id}-rank{r}`, and returns once all have committed theirs. A
    reward that z-scores over the images scored together stays on rank 0: its totals depend on the whole batch."""
    ranks = current_setup().ranks
    order = RolloutOrder(store.url, run, config, iteration, requests, device)
    if ranks is None or getattr(get_reward(config.reward), "batch_dependent", False):
        return _sample(store, order, requests, worker_id)
    ranks.send(order)
    return sample_part(store, order, ranks, worker_id)


def sample_part(store: TensorStore, order: RolloutOrder, ranks, worker_id: str = "trainer") -> int:
    """This rank's contiguous part of the order's requests (sizes differ by at most one), sampled and committed;
    returns how many the ranks committed together (every rank waits for the others)."""
    import torch.distributed as dist

    base, extra = divmod(len(order.requests), ranks.world_size)
    start = ranks.rank * base + min(ranks.rank, extra)
    mine = order.requests[start : start + base + (ranks.rank < extra)]
    won = _sample(store, order, mine, f"{worker_id}-rank{ranks.rank}") if mine else 0
    counts = [0] * ranks.world_size
    dist.all_gather_object(counts, won, group=ranks.orders)
    return sum(counts)


def _sample(store: TensorStore, order: RolloutOrder, requests: list[PlannedRequest], worker_id: str) -> int:
    """Sample and score `requests` on this process's resident policy and commit their results."""
    config = order.config
    policy, _ = resident_checkpoint(store, order.run, requests[0].spec.weights_version, order.device)
    set_row_negatives(policy, negative_prompts(config.prompts))
    t0 = time.perf_counter()
    traj, images, rewards, components = sample_scored(
        policy,
        get_reward(config.reward),
        [r.spec.prompt for r in requests],
        [r.spec.seed for r in requests],
        config.sampler_at(order.iteration),
        config.rollout_batch,
        config.prompts,
        init_seeds=[r.spec.init_seeds[0] for r in requests],
    )
    group_ids = torch.tensor([r.prompt_index for r in requests])
    batch = Rollouts(
        order.iteration,
        traj,
        rewards,
        group_ids,
        torch.zeros_like(rewards),  # advantages: the train phase computes them over whole groups
        time.perf_counter() - t0,
        images=images,
        reward_components=components or None,
    )
    return publish_batch(store, order.run, order.iteration, requests, batch, worker_id)


def request_records(
    requests: list[PlannedRequest], results: list[tuple[dict, dict]], iteration: int, enqueued_at: float | None = None
) -> list:
    """One ledger `requests` row per request with a committed result (non-finite rewards marked failed)."""
    import math

    rows = []
    for req, (_, meta) in zip(requests, results, strict=False):
        reward = float(meta["reward"])
        finite = math.isfinite(reward)
        rows.append(
            RequestRecord(
                request_id=req.request_id,
                iteration=iteration,
                kind="rollout",
                prompt=req.spec.prompt,
                seed=req.spec.seed,
                weights_version=req.spec.weights_version,
                worker_id=meta.get("worker_id"),
                attempts=int(meta.get("attempt", 1)),
                status="done" if finite else "failed",
                result_hash=meta.get("result_hash"),
                reward=reward if finite else None,
                enqueued_at=enqueued_at,
                finished_at=meta.get("finished_at"),
                reward_components=components_json(meta.get("reward_components")),
                kernel_sets=json.dumps(meta["kernel_sets"]) if "kernel_sets" in meta else None,
                mixed_kernels=bool(meta.get("mixed_kernels", False)),
            )
        )
    return rows
