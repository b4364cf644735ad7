"""The explore phase of iteration k, in two halves around training: start beside it, finish when it ends.

`exploration_phase` (right after the rollout) judges the seed plan iteration k sampled with
and enqueues iteration k+1's seed exploration on the now stale weights v(k); idle workers
explore while the trainer turns v(k) into v(k+1). `seed_plan_phase` (after training)
cancels what exploration has left and plans iteration k+1's seeds from what finished
(random seeds where nothing did). Without workers that outlive the rollout phase
(`Sampling.explores`), k+1 gets the default seed plan.

Example:
    exploration_phase(ctx, k); train_phase(ctx, k); seed_plan_phase(ctx, k)
"""

from __future__ import annotations

import dataclasses
import time

from resources.ledger.records import ExplorationRecord
from resources.queue import open_queue
from workers.coordinator import books
from workers.coordinator.context import RunContext
from workers.coordinator.explore_records import exploration_record, explore_request_records, seed_groups, with_review
from workers.coordinator.phases import PhaseResult
from workers.coordinator.plots import line_plot_png
from workers.explore.inprocess import explore_in_process
from workers.explore.planning import review_iteration
from workers.explore.seed_plan import default_seed_plan, publish_seed_plan
from workers.explore.session import finish_exploration, start_exploration
from workers.explore.state import explore_config_for


def explore_config(ctx: RunContext):
    """The run's exploration settings (the preset's when the run gives none), sized to the rollout workers alive
    now (the configured count before any started)."""

    alive = ctx.ledger.query("SELECT count(*) FROM workers WHERE ended_at IS NULL AND role = 'rollout'").rows[0][0]
    return dataclasses.replace(
        ctx.explore_config or explore_config_for(ctx.preset), num_workers=int(alive) or ctx.sampling.num_workers
    )


def exploration_phase(ctx: RunContext, k: int) -> PhaseResult:
    """Judge the plan iteration k sampled with, then enqueue iteration k+1's exploration on weights v(k)."""

    config = explore_config(ctx)
    review = review_iteration(ctx.store, ctx.run, ctx.train, k, config)
    ctx.ledger.record_seed_groups(seed_groups(ctx.store, ctx.run, ctx.train, k, review))
    previous = ctx.ledger.query("SELECT * FROM exploration WHERE iteration = ?", [k - 1]).as_dicts()
    if previous:
        ctx.ledger.record_exploration(with_review(ExplorationRecord(**previous[0]), review))
    meta = {
        "planner_of_this_rollout": review.planner,
        "kendall_tau": review.kendall_tau,
        "spearman_rho": review.spearman_rho,
        "rank_consistency": review.concordance,
        "variance_gain": review.variance_gain,
        "planned_variance": review.planned_variance,
        "random_variance": review.random_variance,
        "next_plan_falls_back": review.fallback,
    }
    if ctx.sampling.explores_in_process:
        return PhaseResult(
            {
                "enabled": True,
                "for_iteration": k + 1,
                "in_process": True,
                "budget_samples": ctx.sampling.explore_samples,
                **meta,
            }
        )
    if not ctx.sampling.explores:
        why = (
            "exploration is switched off"
            if ctx.sampling.mode == "workers"
            else (
                f"rollouts are {ctx.sampling.mode!r}: no worker lives through training to explore (use spotlight run "
                "--rollouts local_pool, or workers on a queue)"
            )
        )
        return PhaseResult({"enabled": False, "why": why, **meta})
    with _queue(ctx) as queue:
        session = start_exploration(ctx.store, queue, ctx.run, ctx.train, k, config)
    ctx.ledger.record_phase(k, "explore", session.started_at)
    return PhaseResult(
        {
            "enabled": True,
            "for_iteration": k + 1,
            "arm": session.arm or "none",
            "reason": session.reason,
            "budget_s": session.budget_s,
            "predicted_s": session.predicted_s,
            "num_requests": len(session.request_ids),
            "num_workers": session.num_workers,
            **meta,
        }
    )


def seed_plan_phase(ctx: RunContext, k: int) -> PhaseResult:
    """Training has ended: cancel what exploration left and publish iteration k+1's seed plan."""

    if not ctx.sampling.explores and not ctx.sampling.explores_in_process:
        plan = default_seed_plan(ctx.train, k + 1)
        publish_seed_plan(ctx.store, ctx.run, plan)
        return PhaseResult({"for_iteration": k + 1, "planner": plan.planner}, tables={"plan": plan_table(plan)})

    train_s = books.phase_cost(ctx.ledger, k, "train")["wall_s"]
    finished = _finish(ctx, k, train_s)
    record = exploration_record(finished)
    ctx.ledger.record_exploration(record)
    ctx.ledger.record_requests(explore_request_records(finished, ctx.train, ctx.run))
    plan = finished.plan
    out = PhaseResult(
        {
            "for_iteration": k + 1,
            "planner": plan.planner,
            "arm": record.arm,
            "reason": finished.session.reason,
            "budget_s": record.budget_s,
            "time_used_s": record.time_used_s,
            "train_s": train_s,
            "overhead_s": record.overhead_s,
            "explored_prompts": finished.num_done,
            "planned_requests_missing": finished.num_missing,
            "cancelled_requests": finished.num_cancelled,
            "explored_reward_variance": record.reward_variance,
        },
        tables={"plan": plan_table(plan)},
    )
    if ctx.draws(k):
        out.pictures = {
            "consistency": (consistency_png(ctx), "rank consistency of stale, cheap rewards with real ones")
        }
    return out


def _finish(ctx: RunContext, k: int, train_s: float):
    """Iteration k+1's plan from exploration: cancel and collect the pool's (its window is the explore phase), or
    explore here on the sample budget (off any critical path: no phase window)."""

    if ctx.sampling.explores_in_process:
        return explore_in_process(
            ctx.store, ctx.run, ctx.train, k, explore_config(ctx), ctx.sampling.explore_samples, ctx.device
        )
    with _queue(ctx) as queue:
        finished = finish_exploration(ctx.store, queue, ctx.run, ctx.train, k, explore_config(ctx), train_s=train_s)
    ctx.ledger.record_phase(k, "explore", finished.session.started_at, time.time())
    return finished


def plan_table(plan) -> list[dict]:
    """The plan as table rows: prompt, seeds, explored rewards (comma-separated; empty when not explored)."""
    rows = zip(plan.prompts, plan.seeds, plan.explored_rewards or [None] * len(plan.seeds), strict=False)
    return [
        {
            "prompt": str(p),
            "seeds": ", ".join(map(str, s)),
            "explored rewards": "" if r is None else ", ".join(f"{x:.2f}" for x in r),
        }
        for p, s, r in rows
    ]


def consistency_png(ctx: RunContext) -> bytes:

    rows = ctx.ledger.query(
        "SELECT iteration, kendall_tau, spearman_rho, variance_gain FROM exploration ORDER BY iteration"
    ).rows
    series = {
        name: ([r[0] for r in rows if r[i] is not None], [r[i] for r in rows if r[i] is not None])
        for i, name in ((1, "Kendall tau"), (2, "Spearman rho"), (3, "variance gain"))
    }
    return line_plot_png(series, "exploration: stale vs real rankings", "iteration (plan made)", "value")


def _queue(ctx: RunContext):

    if ctx.queue_url is None:
        raise ValueError("exploration needs a queue: configure the queue resource (SPOTLIGHT_QUEUE)")
    return open_queue(ctx.queue_url, ctx.queue_config)
