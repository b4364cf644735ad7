"""Walk a run's iteration partitions in this process with `dagster.materialize`: the engine of `spotlight run`.

The same assets, resources and ledger as the Dagster UI; the loop replaces the sensor.
Iterations the ledger records as succeeded are skipped, so walking again after a kill
resumes at the first unfinished iteration and redoes only that one (every asset's writes
are keyed, so redoing it replaces rows instead of adding them).

The walk records on a persistent Dagster instance (`run_instance`): the one DAGSTER_HOME names when it is set,
else `<run-dir>/dagster/`, so every iteration's materializations, metadata and asset checks stay visible in
`dagster dev` afterwards, and a resumed walk adds to the same instance.

Example:
    resources = build_resources(run_dir="runs/demo", preset="cpu_smoke")
    with run_instance(Path("runs/demo")) as instance:
        for outcome in walk_iterations(instance, resources):
            print(outcome.iteration, outcome.skipped, outcome.seconds)
    print(dagster_ui_command(dagster_home(Path("runs/demo"))))
"""

from __future__ import annotations

import contextlib
import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import dagster as dg

from assets import FINAL_ASSETS, ITERATION_ASSETS
from assets.partitions import ITERATIONS, partition_key
from pipelines.sensors import ITERATIONS_TAG
from resources.dagster_resources import with_env_var
from workers.coordinator.driver import completed_iterations

QUEUE_VARIABLE = "SPOTLIGHT_QUEUE"
"""The variable the walk hands the queue URL to Dagster through (pipelines/deploy.py reads the same one)."""
INSTANCE_FOLDER = "dagster"
"""The run folder's Dagster instance, used when DAGSTER_HOME is not set."""
INSTANCE_YAML = """\
# The Dagster instance of one `spotlight run`: runs, event log (materializations, metadata,
# asset checks) and dynamic partitions, in SQLite files in this folder (Dagster's default storage).
# Open it with: DAGSTER_HOME=<this folder> dagster dev -m pipelines.definitions
telemetry:
  enabled: false
"""


def dagster_home(run_dir: Path) -> Path:
    """The instance folder a walk records on: DAGSTER_HOME (absolute, `~` expanded) when set, else
    `<run_dir>/dagster`."""
    env = os.environ.get("DAGSTER_HOME")
    if not env:
        return Path(run_dir) / INSTANCE_FOLDER
    home = Path(env).expanduser()
    if not home.is_absolute():
        raise ValueError(f"DAGSTER_HOME must be an absolute path (Dagster refuses a relative one), got {env!r}")
    return home


def run_instance(run_dir: Path) -> dg.DagsterInstance:
    """The persistent instance of `dagster_home(run_dir)`, created if missing (the run folder's own one with a
    dagster.yaml); use it as a context manager so its storage is closed after the walk."""
    home = dagster_home(run_dir)
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if home == Path(run_dir) / INSTANCE_FOLDER and not config.exists():
        config.write_text(INSTANCE_YAML)
    return dg.DagsterInstance.from_config(str(home))


def dagster_ui_command(home: Path) -> str:
    """The shell command that opens the instance in the Dagster UI."""
    return f"DAGSTER_HOME={shlex.quote(str(home))} dagster dev -m pipelines.definitions"


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
    with queue_url_hidden(resources) as given:
        return dg.materialize(
            ITERATION_ASSETS,
            selection=selection,
            partition_key=key,
            resources=given,
            instance=instance,
            tags={ITERATIONS_TAG: str(target)},
            raise_on_error=False,
            run_config=quiet,
        )


@contextlib.contextmanager
def queue_url_hidden(resources: dict) -> Iterator[dict]:
    """The resources with the queue URL handed to Dagster as `EnvVar(QUEUE_VARIABLE)`, the variable set to it
    in this process meanwhile: a persistent instance keeps each run's job snapshot, which holds every resource's
    config, and a Redis URL may hold a password."""
    url = resources["queue"].url
    if isinstance(url, dg.EnvVar):  # already a variable (the definitions' resources)
        yield resources
        return
    before = os.environ.get(QUEUE_VARIABLE)
    os.environ[QUEUE_VARIABLE] = url
    try:
        yield {**resources, "queue": with_env_var(resources["queue"], "url", QUEUE_VARIABLE)}
    finally:
        if before is None:
            os.environ.pop(QUEUE_VARIABLE, None)
        else:
            os.environ[QUEUE_VARIABLE] = before


def walk_iterations(
    instance: dg.DagsterInstance, resources: dict, check_stop: Callable[[], None] = lambda: None
) -> Iterator[IterationOutcome]:
    """Iterations 0..N in order; yields after each (skipped ones included). `check_stop` runs after each
    iteration's Dagster execution, before its outcome is judged: it raises to stop the walk when a stop signal
    arrived while Dagster held the signal handlers (pipelines/run_stop.py), so an interrupted step reads as the
    interruption it was, not as a failed iteration."""
    ledger = resources["ledger"].get_ledger()
    done = completed_iterations(ledger)
    for k in range(resources["run_config"].num_iterations + 1):
        if k in done:
            yield IterationOutcome(k, skipped=True)
            continue
        started = time.perf_counter()
        result = materialize_iteration(instance, resources, k)
        check_stop()
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
