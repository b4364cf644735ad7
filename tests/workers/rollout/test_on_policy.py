"""Training on what queue workers sampled: the first minibatch's PPO ratio is exactly 1, so nothing is clipped yet."""

from __future__ import annotations

import pytest

from resources.queue.records import Request
from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.coordinator.rollout import PlannedRequest, request_id
from workers.coordinator.train import train_iteration
from workers.rollout.request import work_request
from workers.rollout.state import RolloutSpec, rollout_request
from workers.rollout.weights import PolicyHolder
from workers.task.prompts import iteration_prompts
from workers.trainer.checkpoint import save_checkpoint
from workers.trainer.grpo_trainer import TrainConfig


def _sampled_by_queue_workers(store, policy, config: TrainConfig) -> list[PlannedRequest]:
    """Version 0 published as the trainer's checkpoint and as the workers' PULSE anchor, then each
    request sampled by a rollout worker (BF16-rounded weights, batch of one), as under `spotlight run`."""
    save_checkpoint(store, "demo", 0, policy)
    from workers.rollout.weights import publish_policy

    publish_policy(store, "demo", policy)
    prompts = iteration_prompts(config.seed, 0, config.prompts_per_iteration)
    requests = [
        PlannedRequest(
            request_id(0, i, j), i, j, RolloutSpec("demo", p, 1000 * i + j, 0, config.sampler, config.reward)
        )
        for i, p in enumerate(prompts)
        for j in range(config.group_size)
    ]
    holder = PolicyHolder(store)
    for r in requests:
        out = work_request(
            Request.from_dict(rollout_request(r.request_id, 0, r.spec)),
            1,
            store,
            holder,
            worker_id="w0",
            commit_every=2,
        )
        assert out.status == "done"
    return requests


@pytest.mark.parametrize("forward_dtype", ["auto", "fp32"])
def test_the_first_minibatch_on_the_queue_path_is_unclipped(tmp_store, forward_dtype) -> None:
    from workers.model.tiny_policy import load_policy

    # Flow-GRPO's recipe (cpu_tiny_flow_grpo: clip range 1e-4) on the shipped base, one minibatch.
    sampler = SamplerConfig(num_steps=8, sde_window=(0, 4), forward_dtype=forward_dtype)
    config = TrainConfig(
        iterations=1,
        prompts_per_iteration=2,
        group_size=2,
        sampler=sampler,
        grpo=GRPOConfig(clip_range=1e-4, num_minibatches=1, num_epochs=1),
    )
    requests = _sampled_by_queue_workers(tmp_store, load_policy(), config)
    stats = train_iteration(tmp_store, "demo", config, 0, requests)
    # One minibatch: its ratio exp(log_prob - old_log_prob) is what the stats describe.
    assert stats["approx_kl"] == 0.0 and stats["clip_frac"] == 0.0


def test_later_minibatches_still_see_the_policy_move(tmp_store) -> None:
    from workers.model.tiny_policy import load_policy

    config = TrainConfig(
        iterations=1,
        prompts_per_iteration=2,
        group_size=4,
        sampler=SamplerConfig(num_steps=8, sde_window=(0, 4)),
        grpo=GRPOConfig(lr=1e-3, num_minibatches=1, num_epochs=2),
    )
    requests = _sampled_by_queue_workers(tmp_store, load_policy(), config)
    stats = train_iteration(tmp_store, "demo", config, 0, requests)
    # The old log-probs are fixed before the first step: the second epoch's ratio measures the first's update.
    assert stats["optimizer_steps"] == 2 and stats["approx_kl"] > 0.0
