"""The ledger's rows of seed exploration: the exploration row, its requests and the seed groups.

They live in the coordinator because the coordinator alone writes the ledger (an import-linter
contract); workers/explore/ plans, runs and reviews the exploration itself.
"""

from __future__ import annotations

from resources.keys import exploration_key
from resources.ledger.records import ExplorationRecord, RequestRecord
from resources.store.base import TensorStore
from workers.algo.seeds import candidate_seeds
from workers.explore.payoff import seed_group_rows
from workers.explore.planning import real_rewards
from workers.explore.seed_plan import load_seed_plan
from workers.explore.session import Finished, explored_results
from workers.explore.state import Review
from workers.task.prompt_file import train_prompts
from workers.trainer.grpo_trainer import TrainConfig, default_seeds


def exploration_record(finished: Finished):
    """The ledger's `exploration` row of the iteration (rank consistency and gain come one iteration later)."""
    import math

    s, arm = finished.session, finished.session.arm_spec
    return ExplorationRecord(
        iteration=s.iteration,
        arm=s.arm or "none",
        budget_s=s.budget_s or 0.0,
        time_used_s=finished.time_used_s,
        num_requests=finished.num_done,
        reward_variance=finished.reward_variance,
        ucb_score=None if s.ucb is None or math.isinf(s.ucb) else s.ucb,
        seeds_per_prompt=None if arm is None else arm.seeds_per_prompt,
        cache_level=None if arm is None else arm.cache_level,
        overhead_s=finished.overhead_s,
        fallback_random=finished.plan.planner.startswith("random:fallback"),
    )


def with_review(record, review: Review):
    """The row of the iteration that made the plan, completed by the monitor's verdict on its rollout."""
    import dataclasses

    return dataclasses.replace(
        record,
        rank_consistency=review.concordance,
        kendall_tau=review.kendall_tau,
        spearman_rho=review.spearman_rho,
        variance_gain=review.variance_gain,
    )


def seed_groups(store: TensorStore, run: str, config: TrainConfig, iteration: int, review: Review) -> list[dict]:
    """The ledger's `seed_groups` rows of iteration's rollout, as `review` judged it (workers/explore/payoff.py)."""

    plan = load_seed_plan(store, run, iteration)
    made = iteration > 0 and store.read_manifest(exploration_key(run, iteration - 1)) is not None
    return seed_group_rows(
        plan,
        real_rewards(store, run, plan),
        review,
        config.group_size,
        default_seeds(config, iteration),
        explored_results(store, run, iteration - 1) if made else {},
    )


def explore_request_records(
    finished: Finished, config: TrainConfig, run: str, enqueued_at: float | None = None
) -> list:
    """One ledger `requests` row per exploration request: done (reward = mean explored reward) or cancelled."""

    s = finished.session
    if s.arm is None:
        return []
    prompts = train_prompts(config, s.iteration + 1)
    rows = []
    for i, rid in zip(s.prompt_indices, s.request_ids, strict=False):
        seeds = candidate_seeds(config.seed, s.iteration + 1, i, config.group_size, s.arm_spec.seeds_per_prompt)
        done = finished.results.get(i)
        rows.append(
            RequestRecord(
                request_id=rid,
                iteration=s.iteration,
                kind="explore",
                prompt=prompts[i],
                seed=seeds[0],
                weights_version=s.iteration,
                worker_id=finished.worker_ids.get(i),
                attempts=1,
                status="done" if done else "cancelled",
                reward=None if done is None else sum(done[1]) / len(done[1]),
                enqueued_at=enqueued_at or s.started_at,
                finished_at=finished.finished_at.get(i),
                arm=s.arm,
            )
        )
    return rows
