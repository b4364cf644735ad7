"""A simulated run's figures, read with the same SQL as a real run's ledger (plus what only the simulator knows)."""

from __future__ import annotations

from typing import Any

from resources.ledger import Ledger
from workers.algo.crossing import crossing


def run_metrics(ledger: Ledger, coordinator, target: float | None) -> dict[str, Any]:
    """Total cost, wall, time and cost to `target`, preemptions, rollout-GPU utilisation and throughput."""
    q = lambda sql: ledger.query(sql).as_dicts()  # noqa: E731
    cost = q("SELECT usd_total, usd_spot, usd_reserved FROM run_cost")[0]
    its = q(
        "SELECT count(*) AS n, sum(wall_s) AS wall_s, avg(wall_s) AS mean_wall_s, avg(critical_path_s) AS mean_cp_s "
        "FROM cost_per_iteration"
    )[0]
    pre = q("SELECT count(*) AS n, coalesce(sum(seconds_lost), 0) AS lost_s FROM preemptions")[0]
    gpu = q("SELECT coalesce(sum(lifetime_s * num_gpus), 0) AS gpu_s FROM worker_costs WHERE role = 'rollout'")[0]
    samples = q("SELECT count(*) AS n FROM requests WHERE kind = 'rollout' AND status = 'done'")[0]["n"]
    rollout_s = q(
        "SELECT coalesce(sum(date_diff('microsecond', started_at, ended_at)) / 1e6, 0) AS s FROM phases "
        "WHERE phase = 'rollout'"
    )[0]["s"]
    curve = q("SELECT max(score) AS best, arg_max(score, iteration) AS final FROM validation_curve")[0]
    reached = None
    if target is not None:
        # Linear between validations, as the exploration bench reads its curves: read only at the validations,
        # a run that crosses just after one waits validate_every iterations, and speed-ups between two cadence
        # steps all read alike.
        rows = q("SELECT elapsed_s, cumulative_usd, score FROM validation_curve ORDER BY iteration")
        scores = [r["score"] for r in rows]
        at_s = crossing([r["elapsed_s"] for r in rows], scores, float(target)) if rows else None
        if at_s is not None:
            reached = {"s": at_s, "usd": crossing([r["cumulative_usd"] for r in rows], scores, float(target))}
    explored = q("SELECT count(*) AS n, coalesce(avg(time_used_s), 0) AS used_s FROM exploration WHERE arm <> 'none'")[
        0
    ]
    work = coordinator.cluster.work
    return {
        "usd_total": cost["usd_total"],
        "usd_spot": cost["usd_spot"],
        "usd_reserved": cost["usd_reserved"],
        "wall_h": (its["wall_s"] or 0) / 3600,
        "iterations": its["n"],
        "mean_iteration_s": its["mean_wall_s"],
        "mean_critical_path_s": its["mean_cp_s"],
        "preemptions": pre["n"],
        "seconds_lost": pre["lost_s"],
        "rollout_gpu_utilisation": work.busy_gpu_s / gpu["gpu_s"] if gpu["gpu_s"] else None,
        "lost_gpu_share": work.lost_gpu_s / gpu["gpu_s"] if gpu["gpu_s"] else None,
        "rollout_samples_per_s": samples / rollout_s if rollout_s else None,
        "samples_per_hour": samples / ((its["wall_s"] or 1) / 3600),
        "best_score": curve["best"],
        "target": target,
        "hours_to_target": None if reached is None else reached["s"] / 3600,
        "usd_to_target": None if reached is None else reached["usd"],
        "explored_iterations": explored["n"],
    }
