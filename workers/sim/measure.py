"""A real run's ledger as simulator inputs (service times, workers, preemption trace), and the sim-vs-real check.

What comes from the real ledger, per iteration (`IterationTimes`): the reserved node's
timeline (the time before the iteration, sync, validate, train, whether it explored, and
the seven hand-overs between them, as recorded) and the rollout service times of that
iteration (mean seconds per denoising step, per claim, per exploration request; the
hand-over into the first claim and out of the last result), so the load of that moment is
in them. Per worker process (`WorkerTimes`): its restart delay, start-up (to its first
claim) and exit after a preemption. Run-wide: the workload (prompts, group size, steps),
prices and the preemption trace (slot, time, notice). What the simulator then predicts:
the rollout phases (queue, pulls, preemptions, lease expiry, re-deliveries, commits), the
workers' lifetimes, hence each iteration's wall time, critical path, cost and preemptions.

Example:
    replay = replay_inputs("runs/demo/ledger.duckdb")
    result = simulate(replay.config, replay.times, replay.market, replay.curve, setup=replay.setup, out_dir=out)
    errors = compare(real="runs/demo/ledger.duckdb", simulated=result.ledger_path)
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from resources.cluster.preemption import PreemptionEvent
from resources.keys import BATCH_FIRST_SAMPLE_SQL_RE, BATCH_SAMPLES_SQL_RE
from resources.ledger.db import query_ledger
from workers.sim.config import SimConfig, get_policy
from workers.sim.inputs import IterationTimes, LearningCurve, ServiceTimes, Setup, WorkerTimes
from workers.sim.market import Market

COMPARED = ("wall_s", "critical_path_s", "usd_total", "preemptions")


@dataclass(frozen=True)
class Replay:
    config: SimConfig
    times: ServiceTimes
    market: Market
    curve: LearningCurve
    setup: Setup


def _rows(path: Path, sql: str) -> list[dict]:
    return query_ledger(path, sql).as_dicts()


def _s(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


def _median(values: list[float], default: float) -> float:
    return statistics.median(values) if values else default


def _phase_windows(path: Path) -> tuple[dict[int, dict], dict[int, dict]]:
    its = {r["iteration"]: r for r in _rows(path, "SELECT iteration, started_at, ended_at FROM iterations ORDER BY 1")}
    phases: dict[int, dict] = {}
    for r in _rows(path, "SELECT iteration, phase, started_at, ended_at FROM phases"):
        phases.setdefault(r["iteration"], {})[r["phase"]] = (r["started_at"], r["ended_at"])
    return its, phases


def _timeline(it: dict, p: dict, before_s: float) -> IterationTimes:
    """The reserved node's side of one iteration: phases and the hand-overs between them (GAPS), as recorded."""
    sync, val = p["sync"], p.get("validate")
    if "rollout" not in p:  # the final iteration: sync, validate
        after = val or (sync[1], sync[1])
        return IterationTimes(
            _s(*sync),
            0.0,
            _s(*val) if val else None,
            (_s(it["started_at"], sync[0]), _s(sync[1], after[0]), 0, 0, 0, 0, _s(after[1], it["ended_at"])),
            before_s=before_s,
            explore=False,
        )
    rollout, train = p["rollout"], p["train"]
    explore = p.get("explore")
    explore_start = explore[0] if explore else rollout[1]
    explore_end = explore[1] if explore else train[1]
    # Without validation the explore->validate and validate->train hand-overs are one (put in the first).
    before_train = val[0] if val else train[0]
    gaps = (
        _s(it["started_at"], sync[0]),
        _s(sync[1], rollout[0]),
        _s(rollout[1], explore_start),
        _s(explore_start, before_train),
        _s(val[1], train[0]) if val else 0.0,
        max(0.0, _s(train[1], explore_end)),
        _s(max(explore_end, train[1]), it["ended_at"]),
    )
    return IterationTimes(
        _s(*sync), _s(*train), _s(*val) if val else None, gaps, before_s=before_s, explore=explore is not None
    )


ATTEMPTS_SQL = (
    "SELECT a.worker_id, a.started_at, a.ended_at, a.steps_done, a.resumed_from_step, a.outcome, r.kind, "
    f"r.iteration, coalesce(try_cast(regexp_extract(a.request_id, '{BATCH_SAMPLES_SQL_RE}', 1) AS INTEGER), 1) "
    "AS samples FROM attempts a JOIN requests r ON r.request_id = "
    f"regexp_replace(a.request_id, '{BATCH_FIRST_SAMPLE_SQL_RE[0]}', '{BATCH_FIRST_SAMPLE_SQL_RE[1]}') "
    "ORDER BY a.worker_id, a.started_at"
)
"""Every attempt with its request's kind and iteration, and how many samples it drew. A batched rollout request (a
prompt's seeds in one queue request, `seeds_per_request`; id `it3-p2-s0x8`, workers/coordinator/rollout.py) is
leased and recorded under its queue id, while the ledger's requests are its samples (`it3-p2-s0` ... `s7`): the
attempt takes its kind and iteration from its first sample, and counts `samples` = 8."""


def attempt_rows(path: Path) -> list[dict]:
    """The ledger's attempts as the replay reads them (ATTEMPTS_SQL)."""
    return _rows(path, ATTEMPTS_SQL)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _iteration_times(path: Path, t0: datetime, attempts: list[dict]) -> list[IterationTimes]:
    """Each iteration's timeline, and its rollout service times: mean seconds per denoising step and per claim
    (the load of that moment is in them), the hand-overs into the first claim and out of the last result (each
    its least over the run: a phase that waited for a worker to come up, or for a lease to expire, would count
    that wait twice)."""
    its, phases = _phase_windows(path)
    by_iteration: dict[int, list[dict]] = {}
    for a in attempts:
        by_iteration.setdefault(a["iteration"], []).append(a)
    rollouts = {
        k: [a for a in rows if a["kind"] == "rollout"]
        for k, rows in by_iteration.items()
        if "rollout" in phases.get(k, {})
    }
    windows = [(phases[k]["rollout"], rows) for k, rows in rollouts.items() if rows]
    enqueue_s = min((_s(w[0], min(a["started_at"] for a in rows)) for w, rows in windows), default=None)
    # Out of the last result, also the least: a phase whose last request completed from its committed state when
    # its lease expired (no attempt row) would count that wait here and again in the simulated lease.
    collect = min((_s(max(a["ended_at"] for a in rows), w[1]) for w, rows in windows), default=None)
    collect_s = None if collect is None else max(0.0, collect)
    out, previous_end = [], t0
    for k, it in sorted(its.items()):
        timeline = _timeline(it, phases[k], _s(previous_end, it["started_at"]))
        previous_end = it["ended_at"]
        rows = by_iteration.get(k, [])
        done = [a for a in rows if a["kind"] == "rollout" and a["outcome"] == "done" and a["steps_done"]]
        # A claim's hand-over: one worker's consecutive attempts of one kind. Between its last rollout and its
        # first exploration request a worker waits for the explore phase to enqueue: idle time, not a claim.
        # The simulator's requests are one sample each, so a batched attempt's step and hand-over count as its
        # samples' (each 1/samples of them): the rollout phase's work stays what it was.
        gaps = [
            _s(a["ended_at"], b["started_at"]) / b["samples"]
            for a, b in zip(rows, rows[1:], strict=False)
            if a["worker_id"] == b["worker_id"]
            and a["kind"] == b["kind"]
            and 0 <= _s(a["ended_at"], b["started_at"]) < 1.0
        ]
        explore = [
            _s(a["started_at"], a["ended_at"]) for a in rows if a["kind"] == "explore" and a["outcome"] == "done"
        ]
        step_s = (
            (sum(_s(a["started_at"], a["ended_at"]) for a in done) / sum(a["steps_done"] * a["samples"] for a in done))
            if done
            else None
        )
        out.append(
            dataclasses.replace(
                timeline,
                step_s=step_s,
                claim_s=_mean(gaps),
                enqueue_s=enqueue_s,
                collect_s=collect_s if "rollout" in phases[k] else None,
                explore_request_s=_mean(explore),
            )
        )
    return out


def _worker_times(path: Path, slots: dict[str, list[dict]], t0: datetime) -> dict[str, WorkerTimes]:
    """Each worker process's restart delay (its slot's previous end, or t0, to its start), start-up (to its first
    claim; never ready if it never claimed) and exit (its preemption to its end)."""
    first = {
        r["worker_id"]: r["t"] for r in _rows(path, "SELECT worker_id, min(started_at) AS t FROM attempts GROUP BY 1")
    }
    preempted = {
        r["worker_id"]: r["t"]
        for r in _rows(path, "SELECT worker_id, min(preempted_at) AS t FROM preemptions GROUP BY 1")
    }
    out = {}
    for workers in slots.values():
        previous_end = t0
        for w in workers:
            ended = w["ended_at"] or w["started_at"]
            ready = first.get(w["worker_id"], ended)
            out[w["worker_id"]] = WorkerTimes(
                restart_delay_s=max(0.0, _s(previous_end, w["started_at"])),
                startup_s=max(0.0, _s(w["started_at"], ready)),
                exit_s=_s(preempted[w["worker_id"]], ended) if w["worker_id"] in preempted and w["ended_at"] else None,
            )
            previous_end = ended
    return out


def _typical(per_iteration: list, name: str, default: float) -> float:
    """The median over iterations of one measured phase time (`default` where none was measured)."""
    return _median([getattr(i, name) for i in per_iteration if getattr(i, name) is not None], default)


def _service_times(
    path: Path, attempts: list[dict], per_iteration: list, per_worker: dict, slots: dict[str, list[dict]]
) -> ServiceTimes:
    """The simulator's service times as the ledger measured them: medians over iterations and workers."""
    done = [a for a in attempts if a["kind"] == "rollout" and a["outcome"] == "done"]
    num_steps = max(((a["steps_done"] or 0) + a["resumed_from_step"] for a in done), default=0)
    restarts = [w.restart_delay_s for ws in slots.values() for w in (per_worker[x["worker_id"]] for x in ws[1:])]
    return ServiceTimes(
        model="measured",
        gpu_type="local",
        step_s=_typical(per_iteration, "step_s", 0.01),
        num_steps=int(num_steps or 4),
        claim_s=_typical(per_iteration, "claim_s", 0.01),
        enqueue_s=_typical(per_iteration, "enqueue_s", 0.05),
        collect_s=_typical(per_iteration, "collect_s", 0.05),
        startup_s=_median([w.startup_s for w in per_worker.values()], 5.0),
        restart_delay_s=_median(restarts, 3.0),
        explore_request_s=_typical(per_iteration, "explore_request_s", 0.05),
        sources={"*": f"measured from {path}"},
    )


def replay_inputs(path: str | Path) -> Replay:
    """Simulator inputs measured from a real `spotlight run` ledger (see the module doc)."""
    path = Path(path)
    workers = _rows(path, "SELECT * FROM workers ORDER BY started_at")
    rollout = [w for w in workers if w["role"] == "rollout"]
    if not rollout:
        raise ValueError(
            f"{path}: no rollout workers in the ledger; replay needs a `spotlight run` with worker processes"
        )
    slots: dict[str, list[dict]] = {}
    for w in rollout:
        slots.setdefault(w["worker_id"].split(".")[0], []).append(w)
    t0 = rollout[0]["started_at"]
    per_worker = _worker_times(path, slots, t0)
    attempts = attempt_rows(path)  # read once: the per-iteration times and the run-wide step count both use them
    per_iteration = _iteration_times(path, t0, attempts)
    times = _service_times(path, attempts, per_iteration, per_worker, slots)
    trace = tuple(
        PreemptionEvent(round(_s(t0, p["preempted_at"]), 6), p["worker_id"].split(".")[0], p["notice_s"])
        for p in _rows(path, "SELECT worker_id, preempted_at, notice_s FROM preemptions ORDER BY 2")
    )
    # Seeds per prompt: G, what every prompt draws (the fewest), and a pre-filter's W = keep_factor x G for each
    # explored prompt (the most; cpu_tiny_spot: 12 of 8).
    shape = _rows(
        path,
        "SELECT min(n) AS g, max(n) AS w, count(*) FILTER (WHERE iteration = 0) AS p FROM "
        "(SELECT iteration, count(*) AS n FROM requests WHERE kind = 'rollout' GROUP BY iteration, prompt)",
    )[0]
    iterations = _rows(path, "SELECT max(iteration) AS k FROM iterations")[0]["k"]
    group = int(shape["g"])
    config = SimConfig(
        get_policy("spotlight"),
        num_spot_gpus=len(slots),
        num_trainer_gpus=1,
        gpus_per_node=1,
        iterations=int(iterations),
        prompts_per_iteration=int(shape["p"]),
        group_size=group,
        keep_factor=int(shape["w"]) / group,
        commit_every=2,
        lease_s=10.0,
    )
    trainer = [w for w in workers if w["role"] == "trainer"]
    setup = Setup(
        spot_usd_per_gpu_hour=rollout[0]["usd_per_hour"],
        reserved_usd_per_gpu_hour=trainer[0]["usd_per_hour"] if trainer else 0.0,
        slots=sorted(slots),
        iterations=per_iteration,
        workers=per_worker,
        epoch_s=t0.timestamp() if t0.tzinfo else (t0 - datetime(1970, 1, 1)).total_seconds(),
    )
    curve = LearningCurve((0.0, 1.0), (0.0, 0.0), "replay: scores are not compared")
    return Replay(config, times, Market(f"trace of {path}", trace=trace), curve, setup)


def per_iteration(path: Path) -> list[dict]:
    """Each iteration's COMPARED figures and its rollout phase's seconds (the part the simulator predicts).

    An iteration's preemptions are those after the previous iteration ended, up to its own end: one that falls
    between two iterations delays the next, and each preemption of the run counts once (a simulated boundary a
    fraction of a second off the real one moves an event between iterations only if it falls in that fraction)."""
    return _rows(
        path,
        "SELECT c.iteration, c.wall_s, c.critical_path_s, c.usd_total, "
        "(SELECT count(*) FROM preemptions p, iterations i WHERE i.iteration = c.iteration "
        " AND p.preempted_at < i.ended_at AND NOT EXISTS (SELECT 1 FROM iterations j "
        "  WHERE j.iteration = c.iteration - 1 AND p.preempted_at < j.ended_at)) AS preemptions, "
        "(SELECT coalesce(sum(date_diff('microsecond', f.started_at, f.ended_at)) / 1e6, 0) FROM phases f "
        " WHERE f.iteration = c.iteration AND f.phase = 'rollout') AS rollout_s "
        "FROM cost_per_iteration c ORDER BY 1",
    )


def compare(real: str | Path, simulated: str | Path) -> dict[str, float]:
    """Mean over iterations of each COMPARED figure's relative error, |sim - real| / |real|; for the preemption
    count |sim - real| / max(real, 1) (an iteration without any is off by one per extra event). `rollout_s`
    is the same error of the rollout phases, over the iterations that have one."""
    a, b = per_iteration(Path(real)), per_iteration(Path(simulated))
    if len(a) != len(b):
        raise ValueError(f"the real run has {len(a)} iterations, the simulated one {len(b)}")
    out = {}
    for name in COMPARED:
        floor = 1.0 if name == "preemptions" else 1e-9
        errs = [abs(y[name] - x[name]) / max(abs(x[name]), floor) for x, y in zip(a, b, strict=False)]
        out[name] = sum(errs) / len(errs)
    rollouts = [
        abs(y["rollout_s"] - x["rollout_s"]) / x["rollout_s"] for x, y in zip(a, b, strict=False) if x["rollout_s"] > 0
    ]
    out["rollout_s"] = sum(rollouts) / len(rollouts) if rollouts else 0.0
    return out
