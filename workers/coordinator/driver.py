"""The iteration driver: the phases of iteration k in order, and `spotlight train`'s loop over them.

The Dagster assets run the same phases one asset each (a run-status sensor, or `spotlight
run`, walks the partitions); `run_iteration` runs them in this process in the assets'
order. Iteration k syncs, samples and validates weights version k and trains it into
k+1; iteration N (the run's length) only syncs and validates the trained weights.

Example:
    ctx = RunContext.local(Path("runs/demo"), "demo", "cpu_smoke", get_preset("cpu_smoke"))
    for record in train_records(ctx):
        print(record["iteration"], record["reward_mean"], record["validation_score"])
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

from workers.coordinator.context import RunContext
from workers.coordinator.explore_phases import exploration_phase, seed_plan_phase
from workers.coordinator.phases import PhaseResult, report_phase, rollout_phase, sync_phase, train_phase, validate_phase

Phase = Callable[[RunContext, int], PhaseResult]
ITERATION_PHASES: tuple[tuple[str, Phase], ...] = (
    ("weight_patch", sync_phase),
    ("rollouts", rollout_phase),
    ("exploration", exploration_phase),
    ("policy_update", train_phase),
    ("seed_plan", seed_plan_phase),
    ("validation", validate_phase),
    ("report", report_phase),
)
"""Asset name -> phase, in the order the assets materialize."""
FINAL_PHASES = ("weight_patch", "validation", "report")
"""What the final iteration (k = N) runs: sync and validate the trained weights."""


def completed_iterations(ledger) -> set[int]:
    """Iterations the ledger records as succeeded (a resumed run skips them)."""
    return {int(r[0]) for r in ledger.query("SELECT iteration FROM iterations WHERE status = 'succeeded'").rows}


def run_iteration(ctx: RunContext, k: int) -> dict[str, PhaseResult]:
    """Every phase of iteration k in order (the final iteration's three on k = N); asset name -> its result."""
    return {name: phase(ctx, k) for name, phase in ITERATION_PHASES if not ctx.is_final(k) or name in FINAL_PHASES}


def train_records(ctx: RunContext) -> Iterator[dict]:
    """Run every iteration not yet done, yielding `spotlight train`'s record of each (JSON-ready):
    `iteration` k, the update of weights v(k) into v(k+1) (absent on the final iteration), `step_s`,
    and the held-out validation of v(k) (None fields when k was not validated). Ends after an iteration whose
    validation the reward-hacking guard flagged when the run stops on a flag (`hacking_action` "stop")."""
    done = completed_iterations(ctx.ledger)
    for k in range(ctx.num_iterations + 1):
        if k in done:
            continue
        started = time.perf_counter()
        results = run_iteration(ctx, k)
        record: dict = {"iteration": k}
        for result in results.values():
            record.update(result.record)
        if not ctx.is_final(k):
            record["step_s"] = time.perf_counter() - started
        yield {name: round(v, 6) if isinstance(v, float) else v for name, v in record.items()}
        if record.get("hacking_action") == "stop":
            return  # --on-hacking stop: iteration k is closed, k+1 is where a resumed run continues
