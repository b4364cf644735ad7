"""The phases of one GRPO iteration as Dagster assets, partitioned by iteration (`it-000012`).

Each asset calls one coordinator phase (workers/coordinator/phases.py, explore_phases.py)
and shows what it returned. Iteration k: `weight_patch` publishes weights version k,
`rollouts` samples it with the seeds planned by iteration k-1, `exploration` enqueues
iteration k+1's seed exploration on version k, `policy_update` trains k into k+1 while
idle workers explore, `seed_plan` plans k+1's seeds from what finished, `validation`
scores version k, `report` closes the iteration. Partition it-{N} is the final one: only
`weight_patch`, `validation` and `report` run there, on the trained weights.

Assets pass nothing through Dagster's IO managers: each phase reads its inputs from the
tensor store under explicit keys, so any asset can run in a fresh process.
"""

import dagster as dg
from dagster import AssetExecutionContext

from assets.context import run_context
from assets.metadata import materialize
from assets.partitions import ITERATIONS, iteration_of
from assets.run_config import RunConfigResource
from resources.dagster_resources import LedgerResource, QueueResource, RolloutWorkersResource, TensorStoreResource
from workers.coordinator import explore_phases, phases
from workers.coordinator.hacking_guard import HACKING_CHECK

GROUP = "iteration"
_ASSET = {"partitions_def": ITERATIONS, "group_name": GROUP}


def _check(name: str, asset: str, description: str) -> list[dg.AssetCheckSpec]:
    return [dg.AssetCheckSpec(name, asset=asset, description=description)]


def _run(
    phase,
    context: AssetExecutionContext,
    run_config: RunConfigResource,
    store: TensorStoreResource,
    ledger: LedgerResource,
    queue: QueueResource,
    rollout_workers: RolloutWorkersResource,
) -> dg.MaterializeResult:
    ctx = run_context(run_config, store, ledger, queue, rollout_workers)
    return materialize(phase(ctx, iteration_of(context)))


@dg.asset(
    **_ASSET,
    kinds={"pytorch"},
    check_specs=_check(
        phases.PATCH_CHECK,
        "weight_patch",
        "A fresh receiver (anchor + PULSE patches) reaches the trainer's weights hash.",
    ),
)
def weight_patch(
    context: AssetExecutionContext,
    run_config: RunConfigResource,
    store: TensorStoreResource,
    ledger: LedgerResource,
    queue: QueueResource,
    rollout_workers: RolloutWorkersResource,
):
    """Sync: weights version k in the run's PULSE chain (the base's anchor for k = 0)."""
    return _run(phases.sync_phase, context, run_config, store, ledger, queue, rollout_workers)


@dg.asset(
    **_ASSET,
    deps=[weight_patch],
    kinds={"pytorch"},
    check_specs=_check(phases.REWARDS_CHECK, "rollouts", "Every request has a committed result with a finite reward."),
)
def rollouts(
    context: AssetExecutionContext,
    run_config: RunConfigResource,
    store: TensorStoreResource,
    ledger: LedgerResource,
    queue: QueueResource,
    rollout_workers: RolloutWorkersResource,
):
    """Rollout: the iteration's samples per prompt at weights version k, scored by the reward."""
    return _run(phases.rollout_phase, context, run_config, store, ledger, queue, rollout_workers)


# Right after the rollout, before policy_update: workers explore while it trains.
@dg.asset(**_ASSET, deps=[rollouts], op_tags={"dagster/priority": "10"})
def exploration(
    context: AssetExecutionContext,
    run_config: RunConfigResource,
    store: TensorStoreResource,
    ledger: LedgerResource,
    queue: QueueResource,
    rollout_workers: RolloutWorkersResource,
):
    """Explore (start): judge the plan iteration k sampled with, then enqueue iteration k+1's exploration on v(k)."""
    return _run(explore_phases.exploration_phase, context, run_config, store, ledger, queue, rollout_workers)


@dg.asset(**_ASSET, deps=[rollouts], kinds={"pytorch"})
def policy_update(
    context: AssetExecutionContext,
    run_config: RunConfigResource,
    store: TensorStoreResource,
    ledger: LedgerResource,
    queue: QueueResource,
    rollout_workers: RolloutWorkersResource,
):
    """Train: GRPO on the iteration's rollouts, weights version k -> k+1 (checkpoint in the store)."""
    return _run(phases.train_phase, context, run_config, store, ledger, queue, rollout_workers)


@dg.asset(**_ASSET, deps=[policy_update, exploration])
def seed_plan(
    context: AssetExecutionContext,
    run_config: RunConfigResource,
    store: TensorStoreResource,
    ledger: LedgerResource,
    queue: QueueResource,
    rollout_workers: RolloutWorkersResource,
):
    """Explore (finish): cancel what exploration left when training ends; plan iteration k+1's seeds."""
    return _run(explore_phases.seed_plan_phase, context, run_config, store, ledger, queue, rollout_workers)


@dg.asset(
    **_ASSET,
    deps=[weight_patch],
    kinds={"pytorch"},
    check_specs=_check(
        phases.GUARD_CHECK, "validation", "The held-out score is not more than max_validation_drop below the base's."
    )
    + _check(
        HACKING_CHECK, "validation", "The reward-hacking guard did not flag this validation (docs/REWARD_HACKING.md)."
    ),
)
def validation(
    context: AssetExecutionContext,
    run_config: RunConfigResource,
    store: TensorStoreResource,
    ledger: LedgerResource,
    queue: QueueResource,
    rollout_workers: RolloutWorkersResource,
):
    """Validate: held-out prompts, fixed seeds, ODE sampling, GenEval-style score of weights version k."""
    return _run(phases.validate_phase, context, run_config, store, ledger, queue, rollout_workers)


@dg.asset(**_ASSET, deps=[validation, policy_update, seed_plan])
def report(
    context: AssetExecutionContext,
    run_config: RunConfigResource,
    store: TensorStoreResource,
    ledger: LedgerResource,
    queue: QueueResource,
    rollout_workers: RolloutWorkersResource,
):
    """Close the iteration in the ledger and rewrite the run's report folder (curves, cost, preemptions, sync, grids)."""
    return _run(phases.report_phase, context, run_config, store, ledger, queue, rollout_workers)
