"""Walk a run's iteration partitions in this process with `dagster.materialize`: the engine of `spotlight run`.

The same assets, resources and ledger as the Dagster UI; the loop replaces the sensor.
Iterations the ledger records as succeeded are skipped, so walking again after a kill
resumes at the first unfinished iteration and redoes only that one (every asset's writes
are keyed, so redoing it replaces rows instead of adding them).

Example:
    resources = build_resources(run_dir="runs/demo", preset="cpu_smoke")
    instance = DagsterInstance.ephemeral()
    for k, outcome in walk_iterations(instance, resources):
        print(k, outcome.skipped, outcome.seconds)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator

import dagster as dg

from assets import FINAL_ASSETS, ITERATION_ASSETS
from assets.partitions import ITERATIONS, partition_key
from pipelines.sensors import ITERATIONS_TAG
from workers.coordinator.driver import completed_iterations


class IterationFailedError(RuntimeError):
    """An asset of an iteration failed; the message names it and says how to continue."""


@dataclass
class IterationOutcome:
    iteration: int
    skipped: bool
    seconds: float = 0.0
    metadata: dict[str, dict] = field(default_factory=dict)
    """Asset name -> its materialization metadata (plain values)."""


def materialize_iteration(instance: dg.DagsterInstance, resources: dict, iteration: int) -> dg.ExecuteInProcessResult:
    """Materialize one iteration partition (the final one: only weight_patch, validation, report)."""
    target = resources["run_config"].num_iterations
    key = partition_key(iteration)
    instance.add_dynamic_partitions(ITERATIONS.name, [key])
    selection = FINAL_ASSETS if iteration >= target else ITERATION_ASSETS
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}  # the CLI draws its own progress
    return dg.materialize(
        ITERATION_ASSETS,
        selection=selection,
        partition_key=key,
        resources=resources,
        instance=instance,
        tags={ITERATIONS_TAG: str(target)},
        raise_on_error=False,
        run_config=quiet,
    )


def walk_iterations(instance: dg.DagsterInstance, resources: dict) -> Iterator[IterationOutcome]:
    """Iterations 0..N in order; yields after each (skipped ones included)."""
    ledger = resources["ledger"].get_ledger()
    done = completed_iterations(ledger)
    for k in range(resources["run_config"].num_iterations + 1):
        if k in done:
            yield IterationOutcome(k, skipped=True)
            continue
        started = time.perf_counter()
        result = materialize_iteration(instance, resources, k)
        if not result.success:
            raise IterationFailedError(_failure_text(result, k))
        yield IterationOutcome(k, False, time.perf_counter() - started, _metadata(result))


def _metadata(result: dg.ExecuteInProcessResult) -> dict[str, dict]:
    out = {}
    for event in result.get_asset_materialization_events():
        mat = event.event_specific_data.materialization
        out[mat.asset_key.to_user_string()] = {k: getattr(v, "value", v) for k, v in mat.metadata.items()}
    return out


def _failure_text(result: dg.ExecuteInProcessResult, iteration: int) -> str:
    for event in result.all_events:
        if event.is_step_failure:
            error = event.step_failure_data.error
            cause = error.cause.message if error and error.cause else ""
            return (
                f"iteration {iteration}: step {event.step_key} failed: {error.message.strip() if error else ''} "
                f"{cause.strip()}".strip()
            )
    return f"iteration {iteration} failed"
