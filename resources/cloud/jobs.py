"""A run's spot worker jobs, by name: worker i of the run whose reserved node is the cluster C is the managed job
`C-rollout-i`, so `spotlight status`, `down` and a relaunch see and touch their own run's jobs only, however many
runs share the jobs controller.

Example:
    worker_job_name("run-a", 3)                          # "run-a-rollout-3"
    worker_jobs("run-a")                                 # unfinished jobs of run-a: name, id, status word
    teardown("run-a")                                    # cancels run-a's jobs, then takes run-a down
"""

from __future__ import annotations

import re
from typing import Any, Callable

import sky
from sky import exceptions as sky_exceptions

API_FAILURES = (
    sky_exceptions.ApiServerConnectionError,
    sky_exceptions.ApiServerAuthenticationError,
    sky_exceptions.APIVersionMismatchError,
    sky_exceptions.ServerTemporarilyUnavailableError,
    sky_exceptions.NoCloudAccessError,
    sky_exceptions.CloudUserIdentityError,
)
"""What SkyPilot raises when its API server cannot answer (down, needs a login, another version) or no cloud
account can be read: nothing can be launched or found then."""


def worker_job_name(cluster: str, index: int) -> str:
    """The managed job of spot worker `index` (from 1) of the run whose reserved node is `cluster`."""
    return f"{cluster}-rollout-{index}"


def is_run_worker(job_name: str | None, cluster: str) -> bool:
    """True for a spot worker job of `cluster`'s run: `cluster-rollout-N` exactly (run-a's never match run-ab's)."""
    return bool(re.fullmatch(re.escape(cluster) + r"-rollout-[1-9][0-9]*", job_name or ""))


def worker_jobs(cluster: str, echo: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """`cluster`'s run's unfinished managed spot jobs (name, id, plain status word), from `sky.jobs.queue_v2`. A
    stopped jobs controller (it stops itself once idle) runs no job: [] then, and `echo` says so."""
    try:
        found = sky.jobs.queue_v2(refresh=False, skip_finished=True, name_match=f"{cluster}-rollout-")
        records, *_ = sky.get(found)
    except sky_exceptions.ClusterNotUpError:
        if echo is not None:
            echo("the managed-jobs controller is stopped: no spot worker job is running")
        return []
    return [
        {"name": r.job_name, "job_id": r.job_id, "status": _status_word(r.status)}
        for r in records
        if is_run_worker(r.job_name, cluster)
    ]


def _status_word(status: Any) -> str | None:
    """ManagedJobStatus.RECOVERING -> "RECOVERING" (the enum's value; str() would print the class name)."""
    return None if status is None else str(getattr(status, "value", status))


def teardown(cluster: str, echo: Callable[[str], None] = print) -> None:
    """Cancel `cluster`'s run's spot worker jobs (no other run's), then take its reserved node down (billing stops),
    whatever state the jobs controller is in; a node already gone is reported, not an error."""
    ids = [j["job_id"] for j in worker_jobs(cluster, echo) if j["job_id"] is not None]
    if ids:
        sky.get(sky.jobs.cancel(job_ids=ids))
        echo(f"cancelled {len(ids)} spot worker job(s) of {cluster}")
    try:
        sky.get(sky.down(cluster))
    except sky_exceptions.ClusterDoesNotExist:
        echo(f"{cluster} does not exist (already down)")
        return
    echo(f"{cluster} is down")
