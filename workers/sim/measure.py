"""A real run's ledger as simulator inputs (service times, workers, preemption trace), and the sim-vs-real check.

What comes from the real ledger: per-step seconds, claim and hand-over latencies, worker
start-up and restart delays (attempts, phases, workers); the reserved node's phase times
per iteration (sync, validate, train and the gaps between them, as measured); the workload
(prompts, group size, steps); prices; and the preemption trace (slot, time, notice). What
the simulator then predicts: the rollout phase (queue, pulls, preemptions, re-deliveries),
worker lifetimes, hence each iteration's wall time, critical path, cost and preemptions.

Example:
    replay = replay_inputs("runs/demo/ledger.duckdb")
    result = simulate(replay.config, replay.times, replay.market, replay.curve, setup=replay.setup, out_dir=out)
    errors = compare(real="runs/demo/ledger.duckdb", simulated=result.ledger_path)
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from resources.ledger_db import query_ledger
from resources.preemption import PreemptionEvent
from workers.sim.config import SimConfig, get_policy
from workers.sim.engine import Segments, Setup
from workers.sim.inputs import LearningCurve, ServiceTimes
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


def _segments(path: Path) -> list[Segments]:
    its = {r["iteration"]: r for r in _rows(path, "SELECT iteration, started_at, ended_at FROM iterations ORDER BY 1")}
    phases: dict[int, dict] = {}
    for r in _rows(path, "SELECT iteration, phase, started_at, ended_at FROM phases"):
        phases.setdefault(r["iteration"], {})[r["phase"]] = (r["started_at"], r["ended_at"])
    out = []
    for k, it in sorted(its.items()):
        p = phases[k]
        sync = _s(it["started_at"], p["sync"][1])
        val = p.get("validate")
        if "rollout" not in p:  # the last iteration: sync, validate
            out.append(Segments(sync, 0.0, _s(*val), (_s(p["sync"][1], val[0]), 0, 0, 0, 0, _s(val[1], it["ended_at"]))))
            continue
        explore = p.get("explore", (p["rollout"][1], p["train"][1]))
        after_explore = val[0] if val else p["train"][0]
        g3 = _s(val[1] if val else after_explore, p["train"][0])
        out.append(Segments(sync, _s(*p["train"]), _s(*val) if val else 0.0,
                            (_s(p["sync"][1], p["rollout"][0]), _s(p["rollout"][1], explore[0]), _s(explore[0], after_explore),
                             g3, max(0.0, _s(p["train"][1], explore[1])), _s(max(explore[1], p["train"][1]), it["ended_at"]))))
    return out


def _worker_times(path: Path, slots: dict[str, list[dict]]) -> tuple[float, float]:
    first = {r["worker_id"]: r["t"] for r in _rows(path, "SELECT worker_id, min(started_at) AS t FROM attempts GROUP BY 1")}
    startups, delays = [], []
    for workers in slots.values():
        for prev, nxt in zip(workers, workers[1:]):
            delays.append(_s(prev["ended_at"], nxt["started_at"]))
            if nxt["worker_id"] in first:
                startups.append(_s(nxt["started_at"], first[nxt["worker_id"]]))
    return (min(startups) if startups else 5.0), _median(delays, 3.0)


def _request_times(path: Path) -> dict[str, float]:
    attempts = _rows(path, "SELECT a.worker_id, a.started_at, a.ended_at, a.steps_done, r.kind FROM attempts a "
                           "JOIN requests r USING (request_id) WHERE a.outcome = 'done' ORDER BY a.worker_id, a.started_at")
    rollout = [a for a in attempts if a["kind"] == "rollout" and a["steps_done"]]
    gaps = [_s(a["ended_at"], b["started_at"]) for a, b in zip(rollout, rollout[1:])
            if a["worker_id"] == b["worker_id"] and 0 <= _s(a["ended_at"], b["started_at"]) < 1.0]
    phases = _rows(path, "SELECT p.started_at, p.ended_at, min(a.started_at) AS first, max(a.ended_at) AS last FROM phases p "
                         "JOIN requests r ON r.iteration = p.iteration AND r.kind = 'rollout' JOIN attempts a USING (request_id) "
                         "WHERE p.phase = 'rollout' GROUP BY ALL")
    return {"step_s": _median([_s(a["started_at"], a["ended_at"]) / a["steps_done"] for a in rollout], 0.01),
            "num_steps": max([a["steps_done"] for a in rollout], default=4),
            "claim_s": _median(gaps, 0.01),
            "enqueue_s": _median([_s(p["started_at"], p["first"]) for p in phases], 0.05),
            "collect_s": _median([_s(p["last"], p["ended_at"]) for p in phases], 0.05),
            "explore_request_s": _median([_s(a["started_at"], a["ended_at"]) for a in attempts if a["kind"] == "explore"], 0.05)}


def replay_inputs(path: str | Path) -> Replay:
    """Simulator inputs measured from a real `spotlight run` ledger (see the module doc)."""
    path = Path(path)
    workers = _rows(path, "SELECT * FROM workers ORDER BY started_at")
    rollout = [w for w in workers if w["role"] == "rollout"]
    if not rollout:
        raise ValueError(f"{path}: no rollout workers in the ledger; replay needs a `spotlight run` with worker processes")
    slots: dict[str, list[dict]] = {}
    for w in rollout:
        slots.setdefault(w["worker_id"].split(".")[0], []).append(w)
    t0 = rollout[0]["started_at"]
    startup_s, restart_s = _worker_times(path, slots)
    req = _request_times(path)
    times = ServiceTimes(model="measured", gpu_type="local", step_s=req["step_s"], num_steps=int(req["num_steps"]),
                         claim_s=req["claim_s"], enqueue_s=req["enqueue_s"], collect_s=req["collect_s"],
                         startup_s=startup_s, restart_delay_s=restart_s, explore_request_s=req["explore_request_s"],
                         sources={"*": f"measured from {path}"})
    trace = tuple(PreemptionEvent(round(_s(t0, p["preempted_at"]), 6), p["worker_id"].split(".")[0], p["notice_s"])
                  for p in _rows(path, "SELECT worker_id, preempted_at, notice_s FROM preemptions ORDER BY 2"))
    shape = _rows(path, "SELECT count(DISTINCT prompt) AS p, count(*) AS n, max(iteration) AS k FROM requests "
                        "WHERE kind = 'rollout' AND iteration = 0")[0]
    iterations = _rows(path, "SELECT max(iteration) AS k FROM iterations")[0]["k"]
    config = SimConfig(get_policy("spotlight"), num_spot_gpus=len(slots), num_trainer_gpus=1, gpus_per_node=1,
                       iterations=int(iterations), prompts_per_iteration=int(shape["p"]),
                       group_size=int(shape["n"]) // int(shape["p"]), commit_every=2, lease_s=10.0, validate_every=1)
    trainer = [w for w in workers if w["role"] == "trainer"]
    setup = Setup(spot_usd_per_gpu_hour=rollout[0]["usd_per_hour"],
                  reserved_usd_per_gpu_hour=trainer[0]["usd_per_hour"] if trainer else 0.0, slots=sorted(slots),
                  segments=_segments(path), warmup_s=_s(t0, _rows(path, "SELECT min(started_at) AS t FROM iterations")[0]["t"]),
                  epoch_s=t0.timestamp() if t0.tzinfo else (t0 - datetime(1970, 1, 1)).total_seconds())
    curve = LearningCurve((0.0, 1.0), (0.0, 0.0), "replay: scores are not compared")
    return Replay(config, times, Market(f"trace of {path}", trace=trace), curve, setup)


def per_iteration(path: Path) -> list[dict]:
    return _rows(path, "SELECT c.iteration, c.wall_s, c.critical_path_s, c.usd_total, "
                       "(SELECT count(*) FROM preemptions p, iterations i WHERE i.iteration = c.iteration "
                       " AND p.preempted_at >= i.started_at AND p.preempted_at < i.ended_at) AS preemptions "
                       "FROM cost_per_iteration c ORDER BY 1")


def compare(real: str | Path, simulated: str | Path) -> dict[str, float]:
    """Mean relative error per iteration of each COMPARED figure; preemptions over the whole run
    (|difference of totals| / max(real total, 1)): with 1-3 per iteration, an event at an iteration's boundary
    lands on either side of it, and one event is a 33-100 % error per iteration."""
    a, b = per_iteration(Path(real)), per_iteration(Path(simulated))
    if len(a) != len(b):
        raise ValueError(f"the real run has {len(a)} iterations, the simulated one {len(b)}")
    out = {}
    for name in COMPARED:
        if name == "preemptions":
            total = sum(x[name] for x in a)
            out[name] = abs(sum(y[name] for y in b) - total) / max(total, 1)
            continue
        errs = [abs(y[name] - x[name]) / (abs(x[name]) or 1e-9) for x, y in zip(a, b)]
        out[name] = sum(errs) / len(errs)
    return out
