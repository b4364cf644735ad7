"""The phases of one GRPO iteration as Dagster assets, partitioned by iteration (`it-000012`).

Iteration k: `weight_patch` publishes weights version k (PULSE patch k-1 -> k), `rollouts`
samples the iteration's requests at version k with the seeds planned by iteration k-1,
`exploration` judges the plan k used and enqueues iteration k+1's seed exploration on
version k, `policy_update` trains version k into k+1 while idle workers explore,
`seed_plan` cancels what exploration has left when training ends and plans iteration
k+1's seeds from what finished, `validation` scores version k on the held-out split, and
`report` closes the iteration. Partition it-{N} (N = the run's iterations) is the final
one: only `weight_patch`, `validation` and `report` run there, on the trained weights.

Assets pass nothing through Dagster's IO managers: each reads its inputs from the tensor
store under explicit keys, so any of them can run in a fresh process.
"""


import math
import time

import dagster as dg
from dagster import AssetExecutionContext

from assets import bookkeeping as books
from assets.metadata import histogram_png, image_grid_png, png_markdown
from assets.partitions import ITERATIONS, iteration_of
from assets.run_config import RunConfigResource
from resources.dagster_resources import LedgerResource, QueueResource, RolloutWorkersResource, TensorStoreResource
from resources.keys import iteration_label
from resources.ledger_records import SyncRecord, TrainStepRecord

GROUP = "iteration"
PATCH_CHECK = "patch_reproduces_trainer_hash"
REWARDS_CHECK = "rewards_finite"


def _cost(ledger, k: int, phase: str) -> dict:
    c = books.phase_cost(ledger, k, phase)
    return {"phase_wall_s": round(c["wall_s"], 3), "phase_usd": c["usd"], "phase_usd_spot": c["usd_spot"],
            "phase_usd_reserved": c["usd_reserved"]}


@dg.asset(partitions_def=ITERATIONS, group_name=GROUP, kinds={"pytorch"},
          check_specs=[dg.AssetCheckSpec(PATCH_CHECK, asset="weight_patch",
                                         description="A fresh receiver (anchor + PULSE patches) reaches the trainer's weights hash.")])
def weight_patch(context: AssetExecutionContext, run_config: RunConfigResource, store: TensorStoreResource,
                 ledger: LedgerResource, queue: QueueResource) -> dg.MaterializeResult:
    """Sync: weights version k in the run's PULSE chain (the base's anchor for k = 0)."""
    from workers.coordinator.sync import publish_version

    k, led = iteration_of(context), ledger.get_ledger()
    books.begin_iteration(led, run_config, store.url, queue.url, k)
    with books.phase(led, k, "sync"):
        out = publish_version(store.get_store(), run_config.run, k, anchor_every=run_config.anchor_every, base=run_config.checkpoint)
    led.record_sync(SyncRecord(version=k, kind=out.kind, dense_bytes=out.dense_bytes, patch_bytes=out.sent_bytes,
                               iteration=k, changed_fraction=out.changed_fraction, encode_s=out.encode_s,
                               apply_s=out.apply_s, weights_hash=out.trainer_hash))
    meta = {"weights_version": k, "kind": out.kind, "dense_bytes": out.dense_bytes, "sent_bytes": out.sent_bytes,
            "times_smaller": round(out.dense_bytes / max(out.sent_bytes, 1), 2),
            "changed_fraction": out.changed_fraction, "encode_s": out.encode_s, "apply_s": out.apply_s,
            "weights_hash": out.trainer_hash, "anchor_stored": out.anchored, **_cost(led, k, "sync")}
    check = dg.AssetCheckResult(check_name=PATCH_CHECK, passed=out.reproduced,
                                metadata={"trainer_hash": out.trainer_hash, "receiver_hash": out.receiver_hash})
    return dg.MaterializeResult(metadata=meta, check_results=[check])


@dg.asset(partitions_def=ITERATIONS, group_name=GROUP, deps=[weight_patch], kinds={"pytorch"},
          check_specs=[dg.AssetCheckSpec(REWARDS_CHECK, asset="rollouts",
                                         description="Every request has a committed result with a finite reward.")])
def rollouts(context: AssetExecutionContext, run_config: RunConfigResource, store: TensorStoreResource,
             ledger: LedgerResource, queue: QueueResource, rollout_workers: RolloutWorkersResource) -> dg.MaterializeResult:
    """Rollout: the iteration's G samples per prompt at weights version k, scored by the reward."""
    from assets.rollout_phase import run_rollout_phase
    from workers.coordinator.rollout import iteration_requests, load_results, request_records
    from workers.explore.seed_plan import plan_for_iteration

    k, led, st, cfg = iteration_of(context), ledger.get_ledger(), store.get_store(), run_config.train_config()
    plan = plan_for_iteration(st, run_config.run, cfg, k)
    requests = iteration_requests(cfg, run_config.run, k, weights_version=k, plan=plan)
    with books.phase(led, k, "rollout"):
        summary = run_rollout_phase(rollout_workers, st, queue.url, led, run_config.run, cfg, k, requests)
    results = load_results(st, run_config.run, k, requests)
    led.record_requests(request_records(requests, results, k, enqueued_at=summary.enqueued_at))
    rewards = [float(m["reward"]) for _, m in results]
    finite = [r for r in rewards if math.isfinite(r)]
    grid = image_grid_png(_stack([t["image"].numpy() for t, _ in results]), columns=max(len(g) for g in plan.seeds))
    _write_grid(ledger, f"{iteration_label(k)}-rollouts.png", grid)
    meta = {"mode": summary.mode, "num_requests": len(requests), "planner": plan.planner,
            "reward_mean": sum(finite) / max(len(finite), 1), "reward_min": min(finite, default=float("nan")),
            "reward_max": max(finite, default=float("nan")), "retried_requests": sum(int(m.get("attempt", 1)) > 1 for _, m in results),
            "preemptions": summary.preemptions, "workers_started": summary.workers_started,
            "reward_histogram": png_markdown(histogram_png(finite, f"rewards, iteration {k}", "reward"), "rewards"),
            "samples": png_markdown(grid, "one row per prompt, one column per seed"),
            **_cost(led, k, "rollout")}
    check = dg.AssetCheckResult(check_name=REWARDS_CHECK, passed=len(finite) == len(requests),
                                metadata={"finite": len(finite), "requests": len(requests)})
    return dg.MaterializeResult(metadata=meta, check_results=[check])


@dg.asset(partitions_def=ITERATIONS, group_name=GROUP, deps=[rollouts], kinds={"pytorch"})
def policy_update(context: AssetExecutionContext, run_config: RunConfigResource, store: TensorStoreResource,
                  ledger: LedgerResource) -> dg.MaterializeResult:
    """Train: GRPO on the iteration's rollouts, weights version k -> k+1 (checkpoint in the store)."""
    from workers.coordinator.rollout import iteration_requests
    from workers.explore.seed_plan import load_seed_plan
    from workers.coordinator.train import train_iteration

    k, led, st, cfg = iteration_of(context), ledger.get_ledger(), store.get_store(), run_config.train_config()
    requests = iteration_requests(cfg, run_config.run, k, weights_version=k, plan=load_seed_plan(st, run_config.run, k))
    with books.phase(led, k, "train") as window:
        stats = train_iteration(st, run_config.run, cfg, k, requests)
    led.record_train_step(TrainStepRecord(
        iteration=k, step=0, loss=stats.get("loss"), kl=stats.get("kl"), reward_mean=stats["reward_mean"],
        reward_std=stats["reward_std"], zero_std_ratio=stats["zero_std_ratio"], clip_fraction=stats.get("clip_frac"),
        grad_norm=stats.get("grad_norm"), learning_rate=stats.get("learning_rate", cfg.grpo.lr), duration_s=window.seconds))
    meta = {"weights_version_out": k + 1, **{k_: float(v) for k_, v in stats.items()}, **_cost(led, k, "train")}
    return dg.MaterializeResult(metadata=meta)


EXPLORING_MODE = "workers"
"""Exploration needs workers that outlive the rollout phase: queue workers (spotlight run's run-long
cluster, SkyPilot spot jobs). In-process rollouts have none, and a per-phase local cluster is gone by training."""


def _explore_config(rollout_workers: RolloutWorkersResource, led):
    from workers.explore.state import ExploreConfig

    alive = led.query("SELECT count(*) FROM workers WHERE ended_at IS NULL AND role = 'rollout'").rows[0][0]
    return ExploreConfig(num_workers=int(alive) or rollout_workers.num_workers)


@dg.asset(partitions_def=ITERATIONS, group_name=GROUP, deps=[rollouts],
          op_tags={"dagster/priority": "10"})  # right after the rollout, before policy_update: workers explore while it trains
def exploration(context: AssetExecutionContext, run_config: RunConfigResource, store: TensorStoreResource,
                ledger: LedgerResource, queue: QueueResource, rollout_workers: RolloutWorkersResource) -> dg.MaterializeResult:
    """Explore (start): judge the plan iteration k sampled with, then enqueue iteration k+1's exploration on weights v(k)."""
    from workers.coordinator.explore import review_iteration, start_exploration, with_review

    k, led, st, cfg = iteration_of(context), ledger.get_ledger(), store.get_store(), run_config.train_config()
    explore_config = _explore_config(rollout_workers, led)
    review = review_iteration(st, run_config.run, cfg, k, explore_config)
    previous = led.query("SELECT * FROM exploration WHERE iteration = ?", [k - 1]).as_dicts()
    if previous:
        from resources.ledger_records import ExplorationRecord

        led.record_exploration(with_review(ExplorationRecord(**previous[0]), review))
    meta = {"planner_of_this_rollout": review.planner, "kendall_tau": review.kendall_tau, "spearman_rho": review.spearman_rho,
            "rank_consistency": review.concordance, "variance_gain": review.variance_gain,
            "planned_variance": review.planned_variance, "random_variance": review.random_variance,
            "next_plan_falls_back": review.fallback}
    if rollout_workers.mode != EXPLORING_MODE:
        return dg.MaterializeResult(metadata={"enabled": False, "why": f"rollouts are {rollout_workers.mode!r}: no worker "
                                              "lives through training to explore (use spotlight run --rollouts local_cluster, "
                                              "or workers on a queue)", **meta})
    with queue.get_queue() as q:
        session = start_exploration(st, q, run_config.run, cfg, k, explore_config)
    led.record_phase(k, "explore", session.started_at)
    return dg.MaterializeResult(metadata={
        "enabled": True, "for_iteration": k + 1, "arm": session.arm or "none", "reason": session.reason,
        "budget_s": session.budget_s, "predicted_s": session.predicted_s, "num_requests": len(session.request_ids),
        "num_workers": session.num_workers, **meta})


@dg.asset(partitions_def=ITERATIONS, group_name=GROUP, deps=[policy_update, exploration])
def seed_plan(context: AssetExecutionContext, run_config: RunConfigResource, store: TensorStoreResource,
              ledger: LedgerResource, queue: QueueResource, rollout_workers: RolloutWorkersResource) -> dg.MaterializeResult:
    """Explore (finish): training has ended, so exploration still pending is cancelled and iteration k+1's seeds
    are planned from what finished (random seeds where nothing did)."""
    from workers.explore.seed_plan import default_seed_plan, publish_seed_plan

    k, led, st, cfg = iteration_of(context), ledger.get_ledger(), store.get_store(), run_config.train_config()
    if rollout_workers.mode != EXPLORING_MODE:
        plan = default_seed_plan(cfg, k + 1)
        publish_seed_plan(st, run_config.run, plan)
        return dg.MaterializeResult(metadata={"for_iteration": k + 1, "planner": plan.planner, "plan": _plan_table(plan)})
    from workers.coordinator.explore import exploration_record, explore_request_records, finish_exploration

    train_s = books.phase_cost(led, k, "train")["wall_s"]
    with queue.get_queue() as q:
        finished = finish_exploration(st, q, run_config.run, cfg, k, _explore_config(rollout_workers, led), train_s=train_s)
    led.record_phase(k, "explore", finished.session.started_at, time.time())
    record = exploration_record(finished)
    led.record_exploration(record)
    led.record_requests(explore_request_records(finished, cfg, run_config.run))
    plan = finished.plan
    return dg.MaterializeResult(metadata={
        "for_iteration": k + 1, "planner": plan.planner, "arm": record.arm, "budget_s": record.budget_s,
        "time_used_s": record.time_used_s, "train_s": train_s, "overhead_s": record.overhead_s,
        "explored_prompts": finished.num_done, "cancelled_requests": finished.num_cancelled,
        "explored_reward_variance": record.reward_variance, "plan": _plan_table(plan),
        "consistency": png_markdown(_consistency_png(led), "rank consistency of stale, cheap rewards with real ones")})


def _plan_table(plan) -> dg.MetadataValue:
    rows = zip(plan.prompts, plan.seeds, plan.explored_rewards or [None] * len(plan.seeds))
    return dg.MetadataValue.md("| prompt | seeds | explored rewards |\n|---|---|---|\n" + "".join(
        f"| {p} | {', '.join(map(str, s))} | {'' if r is None else ', '.join(f'{x:.2f}' for x in r)} |\n" for p, s, r in rows))


def _consistency_png(led) -> bytes:
    from assets.metadata import line_plot_png

    rows = led.query("SELECT iteration, kendall_tau, spearman_rho, variance_gain FROM exploration ORDER BY iteration").rows
    series = {name: ([r[0] for r in rows if r[i] is not None], [r[i] for r in rows if r[i] is not None])
              for i, name in ((1, "Kendall tau"), (2, "Spearman rho"), (3, "variance gain"))}
    return line_plot_png(series, "exploration: stale vs real rankings", "iteration (plan made)", "value")


def _write_grid(ledger: LedgerResource, name: str, png: bytes) -> None:
    """Sample grids go to the report folder next to the ledger (the report page links them)."""
    from pathlib import Path

    out = Path(ledger.path).parent / "report" / "grids"
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(png)


def _stack(images):
    import numpy as np

    return np.stack(images)
