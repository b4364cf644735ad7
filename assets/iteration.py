"""The phases of one GRPO iteration as Dagster assets, partitioned by iteration (`it-000012`).

Each asset calls one coordinator phase (workers/coordinator/phases.py, explore_phases.py)
and shows what it returned. Iteration k: `weight_patch` publishes weights version k,
`rollouts` samples it with the seeds planned by iteration k-1, `exploration` enqueues
iteration k+1's seed exploration on version k, `policy_update` trains k into k+1 while
idle workers explore, `seed_plan` plans k+1's seeds from what finished, `validation`
scores version k, `report` closes the iteration. Partition it-{N} is the final one: only
`weight_patch`, `validation` and `report` run there, on the trained weights.

Every asset is in the `iteration` group (one iteration's lineage reads as one graph), owned by
OWNER, tagged with its phase, and needs the same four resources (RUN_RESOURCES), from which
`run_context` builds what the phase sees. Assets pass nothing through Dagster's IO managers:
each phase reads its inputs from the tensor store under explicit keys, so any asset can run in
a fresh process.
"""

from typing import Callable, Sequence

import dagster as dg
from dagster import AssetExecutionContext

from assets.context import run_context
from assets.metadata import materialize
from assets.partitions import ITERATIONS, iteration_of
from workers.coordinator import explore_phases, phases
from workers.coordinator.context import RunContext
from workers.coordinator.hacking_guard import HACKING_CHECK
from workers.coordinator.phases import PhaseResult

GROUP = "iteration"
OWNER = "team:spotlight"
RUN_RESOURCES = frozenset({"run_config", "store", "ledger", "queue"})
"""The resource keys every phase needs (assets/context.py turns them into a RunContext)."""

Phase = Callable[[RunContext, int], PhaseResult]


def phase_context(context: AssetExecutionContext) -> RunContext:
    """The RunContext of the resources an asset run was given."""
    return run_context(**{key: getattr(context.resources, key) for key in RUN_RESOURCES})


def phase_asset(
    name: str,
    phase: Phase,
    *,
    description: str,
    phase_tag: str,
    kinds: set[str],
    deps: Sequence[str] = (),
    checks: Sequence[tuple[str, str]] = (),
    op_tags: dict | None = None,
) -> dg.AssetsDefinition:
    """An iteration asset that runs `phase` on its partition's iteration and shows what it returned;
    `checks`: (check name, description) of the asset checks the phase evaluates."""

    @dg.asset(
        name=name,
        description=description,
        partitions_def=ITERATIONS,
        group_name=GROUP,
        owners=[OWNER],
        tags={"phase": phase_tag},
        kinds=kinds,
        deps=list(deps),
        check_specs=[dg.AssetCheckSpec(check, asset=name, description=text) for check, text in checks],
        required_resource_keys=set(RUN_RESOURCES),
        op_tags=op_tags,
    )
    def _phase(context: AssetExecutionContext) -> dg.MaterializeResult:
        return materialize(phase(phase_context(context), iteration_of(context)))

    return _phase


weight_patch = phase_asset(
    "weight_patch",
    phases.sync_phase,
    description="Sync: weights version k in the run's PULSE chain (the base's anchor for k = 0).",
    phase_tag="sync",
    kinds={"pytorch", "safetensors"},
    checks=[
        (
            phases.PATCH_CHECK,
            "A receiver at version k-1 (kept from the last sync, or replayed from the anchor) applies the PULSE patch "
            "and reaches the trainer's weights hash.",
        )
    ],
)
rollouts = phase_asset(
    "rollouts",
    phases.rollout_phase,
    description="Rollout: the iteration's samples per prompt at weights version k, scored by the reward.",
    phase_tag="rollout",
    kinds={"pytorch"},
    deps=["weight_patch"],
    checks=[(phases.REWARDS_CHECK, "Every request has a committed result with a finite reward.")],
)
# Right after the rollout, before policy_update: workers explore while it trains.
exploration = phase_asset(
    "exploration",
    explore_phases.exploration_phase,
    description="Explore (start): judge the plan iteration k sampled with, then enqueue iteration k+1's "
    "exploration on v(k).",
    phase_tag="explore",
    kinds={"python"},
    deps=["rollouts"],
    op_tags={"dagster/priority": "10"},
)
policy_update = phase_asset(
    "policy_update",
    phases.train_phase,
    description="Train: GRPO on the iteration's rollouts, weights version k -> k+1 (checkpoint in the store).",
    phase_tag="train",
    kinds={"pytorch"},
    deps=["rollouts"],
)
seed_plan = phase_asset(
    "seed_plan",
    explore_phases.seed_plan_phase,
    description="Explore (finish): cancel what exploration left when training ends; plan iteration k+1's seeds.",
    phase_tag="explore",
    kinds={"python"},
    deps=["policy_update", "exploration"],
)
validation = phase_asset(
    "validation",
    phases.validate_phase,
    description="Validate: held-out prompts, fixed seeds, ODE sampling, GenEval-style score of weights version k.",
    phase_tag="validate",
    kinds={"pytorch"},
    deps=["weight_patch"],
    checks=[
        (phases.GUARD_CHECK, "The held-out score is not more than max_validation_drop below the base's."),
        (HACKING_CHECK, "The reward-hacking guard did not flag this validation (docs/REWARD_HACKING.md)."),
    ],
)
report = phase_asset(
    "report",
    phases.report_phase,
    description="Close the iteration in the ledger and rewrite the run's report folder (curves, cost, "
    "preemptions, sync, grids).",
    phase_tag="report",
    kinds={"duckdb", "html"},
    deps=["validation", "policy_update", "seed_plan"],
)
