"""The run-status sensor that starts iteration k+1 when iteration k's run succeeds.

Dynamic partitions cannot depend on each other, so this is how the pipeline walks from
one iteration to the next in the UI (`spotlight run` walks the same assets in a loop).
The run key `{run}/it-000013` makes it idempotent: a second success of iteration 12 (a
re-execution) never launches iteration 13 twice. The target length comes from the
finished run's `spotlight/iterations` tag (else the run config), and the run after the
last training iteration materializes only the final assets.
"""

import dagster as dg
from dagster import RunStatusSensorContext

from assets import FINAL_ASSETS, ITERATION_ASSETS
from assets.partitions import ITERATIONS, iteration_of_key, partition_key
from assets.run_config import RunConfigResource

ITERATIONS_TAG = "spotlight/iterations"

iteration_job = dg.define_asset_job(
    "iteration",
    selection=ITERATION_ASSETS,
    executor_def=dg.in_process_executor,
    description="One GRPO iteration: sync, rollout, train, explore, validate, report.",
)


def next_iteration_request(run_name: str, finished_key: str, target: int) -> tuple[str, dg.RunRequest] | None:
    """The partition to add and the run to launch after `finished_key` succeeded (None after the final one)."""
    k = iteration_of_key(finished_key)
    if k >= target:
        return None
    key = partition_key(k + 1)
    selection = [a.key for a in FINAL_ASSETS] if k + 1 == target else None
    return key, dg.RunRequest(
        run_key=f"{run_name}/{key}", partition_key=key, asset_selection=selection, tags={ITERATIONS_TAG: str(target)}
    )


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS,
    monitored_jobs=[iteration_job],
    request_job=iteration_job,
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=5,
    description="Starts iteration k+1 when iteration k succeeds.",
)
def next_iteration(context: RunStatusSensorContext, run_config: dg.ResourceParam[RunConfigResource]):
    finished = context.dagster_run
    key = finished.tags.get("dagster/partition")
    if key is None:
        return dg.SkipReason(f"run {finished.run_id} has no iteration partition")
    target = int(finished.tags.get(ITERATIONS_TAG, run_config.num_iterations))
    nxt = next_iteration_request(run_config.run, key, target)
    if nxt is None:
        return dg.SkipReason(f"{key} was the final iteration of {target}")
    new_key, request = nxt
    return dg.SensorResult(
        run_requests=[request], dynamic_partitions_requests=[ITERATIONS.build_add_request([new_key])]
    )
