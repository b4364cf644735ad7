"""The simulated coordinator: one iteration after another on SimPy time, with the real queue, bandit and ledger.

Iteration k (as `spotlight run` orders it): sync, rollout (P x G requests through the
queue, pulled by the simulated GPUs), exploration of iteration k+1's prompts on stale
weights beside training (spotlight only: the real `UCBBandit` picks the arm within the
predicted training time), validation when due, training on the reserved node. The last
iteration only syncs and validates. Validation scores come from a learning curve, read at
the run's training progress (an iteration on explored seeds counts `explore_speedup`).

Example:
    result = simulate(SimConfig(get_policy("spotlight"), num_spot_gpus=16), model_preset("qwen-image-20b"),
                      parse_market("10-15%"), default_curve(), out_dir=Path("sim/spotlight-16"))
    result.metrics["usd_total"]
"""

from __future__ import annotations

import math
import os
import random
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import simpy

from resources.cluster.preemption import PreemptionEvent
from resources.ledger import Ledger
from resources.prices import PriceTable, load_prices
from resources.queue.base import QueueConfig
from resources.queue.sqlite import SqliteQueue
from workers.algo.bandit import predict_budget_s
from workers.explore.request import CACHE_LEVELS
from workers.explore.state import ExploreConfig
from workers.sim.books import SimBooks
from workers.sim.cluster import SimCluster, Slot
from workers.sim.config import SimConfig
from workers.sim.inputs import IterationTimes, LearningCurve, ServiceTimes, Setup
from workers.sim.market import Market
from workers.sim.metrics import run_metrics

VARIANCE_GAIN = 1.26
"""Reward-variance gain of a planned group over random seeds:
`spotlight bench exploration --seed 0` (docs/BENCHMARKS.md)."""


@dataclass
class SimResult:
    config: SimConfig
    ledger_path: Path
    metrics: dict[str, Any] = field(default_factory=dict)


class SimCoordinator:
    def __init__(
        self,
        config: SimConfig,
        times: ServiceTimes,
        events: list[PreemptionEvent],
        curve: LearningCurve,
        prices: PriceTable,
        setup: Setup,
        workdir: Path,
    ) -> None:
        self.config, self.times, self.curve, self.setup = config, times, curve, setup
        self.env = simpy.Environment()
        self.books = SimBooks(setup.epoch_s)
        self.rng = random.Random(config.seed)
        policy = config.policy
        names = list(setup.slots or [f"g{i}" for i in range(config.num_spot_gpus)])
        slots = [Slot(n, node=i // config.gpus_per_node) for i, n in enumerate(names)]
        clock = lambda: setup.epoch_s + self.env.now  # noqa: E731 - the queue's lease clock is simulated time
        qconfig = QueueConfig(max_deliveries=1000)
        keys = ["all"] if policy.pull else sorted({s.node for s in slots})
        self.queues = {k: SqliteQueue(workdir / f"queue-{k}.db", qconfig, clock=clock) for k in keys}
        spot_rate, spot_source = self._price(
            prices,
            spot=policy.spot,
            given=setup.spot_usd_per_gpu_hour if policy.spot else setup.reserved_usd_per_gpu_hour,
        )
        self.reserved_rate, self.reserved_source = self._price(
            prices, spot=False, given=setup.reserved_usd_per_gpu_hour
        )
        self.cluster = SimCluster(
            self.env, self.queues, self.books, times, config, slots, spot_rate, spot_source, worker_times=setup.workers
        )
        self.cluster.on_done = self._on_done
        self.events = events if policy.spot else []
        self.bandit = ExploreConfig().new_bandit(config.group_size) if policy.explore else None
        self.train_history: list[float] = []
        self.progress, self.explored_share = 0.0, 0.0
        self.pending: dict[str, int] = {}
        self.rollout_done = None
        self.explore_log: dict[str, float] = {}
        self.end_s = 0.0

    def _price(self, prices: PriceTable, *, spot: bool, given: float | None) -> tuple[float, str]:
        if given is not None:
            return given, "given to the simulator"
        return prices.usd_per_hour(self.times.gpu_type, spot=spot)

    def run(self) -> None:
        self.cluster.start_all()
        for event in self.events:
            self.env.process(self._preemption(event))
        done = self.env.process(self._driver())
        self.env.run(until=done)
        self.end_s = self.env.now

    def _preemption(self, event: PreemptionEvent):
        yield self.env.timeout(event.time_s)
        self.cluster.preempt(event.worker, event.notice_s)

    def _driver(self):
        for k in range(self.config.iterations + 1):
            yield from self._iteration(k)

    def segments(self, k: int) -> IterationTimes:
        if self.setup.iterations is not None:
            return self.setup.iterations[min(k, len(self.setup.iterations) - 1)]
        t, cfg = self.times, self.config
        train_s = t.update_s_per_sample * cfg.samples_per_iteration / cfg.num_trainer_gpus
        validates = k % cfg.validate_every == 0 or k == cfg.iterations
        return IterationTimes(
            t.sync_s, train_s, t.validate_s if validates else None, t.gaps_s, before_s=t.between_s if k > 0 else 0.0
        )

    def _phase(self, k: int, name: str, seconds: float):
        start = self.env.now
        yield self.env.timeout(seconds)
        self.books.phase(k, name, start, self.env.now)

    def _iteration(self, k: int):
        seg, last = self.segments(k), k == self.config.iterations
        gaps = seg.gaps_s
        yield self.env.timeout(seg.before_s)
        start, reserved = self.env.now, f"reserved-it-{k:06d}"
        self.books.worker_start(
            reserved,
            role="trainer",
            spot=False,
            num_gpus=self.config.num_trainer_gpus,
            usd_per_hour=self.reserved_rate * self.config.num_trainer_gpus,
            gpu_type=self.times.gpu_type,
            t=start,
            source=self.reserved_source,
        )
        yield self.env.timeout(gaps[0])
        yield from self._phase(k, "sync", seg.sync_s)
        yield self.env.timeout(gaps[1])
        if last:
            if seg.validate_s is not None:
                yield from self._validate(k, seg)
        else:
            yield from self._rollout(k, seg)
            yield self.env.timeout(gaps[2])
            explore_start = self.env.now
            exploring = self._start_exploration(k, seg) if self.bandit is not None and seg.explore else None
            yield self.env.timeout(gaps[3])
            if seg.validate_s is not None:
                yield from self._validate(k, seg)
            yield self.env.timeout(gaps[4])
            yield from self._phase(k, "train", seg.train_s)
            self.train_history.append(seg.train_s)
            self._advance_progress()
            if exploring is not None:
                yield self.env.timeout(gaps[5])
                self._end_exploration(k, exploring, explore_start, seg.train_s)
        yield self.env.timeout(gaps[6])
        self.books.worker_end(reserved, "finished", self.env.now)
        self.books.iteration(k, start, self.env.now)

    def _validate(self, k: int, seg: IterationTimes):
        yield from self._phase(k, "validate", seg.validate_s)
        self.books.add(
            "validation",
            iteration=k,
            weights_version=k,
            score=self.curve.score(self.progress),
            num_prompts=self.config.prompts_per_iteration,
            recorded_at=self.env.now,
        )

    def _advance_progress(self) -> None:
        """The update just trained moves the run along the curve; explored seeds count explore_speedup."""
        self.progress += 1 + (self.config.explore_speedup - 1) * self.explored_share
        self.explored_share = 0.0

    def _put(self, requests: list[dict]) -> None:
        for r in requests:
            self.cluster.enqueued_at[r["request_id"]] = self.env.now
        for queue_key, queue in self.queues.items():
            mine = (
                requests
                if queue_key == "all"
                else [r for i, r in enumerate(requests) if i % len(self.queues) == queue_key]
            )
            if mine:
                queue.put(mine)
        self.cluster.notify_all()

    def _rollout(self, k: int, seg: IterationTimes):
        start, t = self.env.now, self.times
        yield self.env.timeout(_given(seg.enqueue_s, t.enqueue_s))
        payload = {
            "steps": t.num_steps,
            "step_s": _given(seg.step_s, t.step_s),
            "claim_s": _given(seg.claim_s, t.claim_s),
        }
        requests = [
            {"request_id": f"it{k}-p{p}-s{s}", "iteration": k, "kind": "rollout", "payload": payload}
            for p, seeds in enumerate(self._rollout_seeds())
            for s in range(seeds)
        ]
        self.pending["rollout"] = len(requests)
        self.rollout_done = self.env.event()
        self._put(requests)
        yield self.rollout_done
        yield self.env.timeout(_given(seg.collect_s, t.collect_s))
        self.books.phase(k, "rollout", start, self.env.now)
        self._record_requests(requests, k, None)

    def _rollout_seeds(self) -> list[int]:
        """Seeds sampled per prompt this rollout: W = keep_factor x G on the prompts the plan explored (the
        pre-filter's final pick happens on the fresh rewards, on the critical path), G on the others."""
        cfg = self.config
        explored = round(self.explored_share * cfg.prompts_per_iteration)
        wide = math.ceil(cfg.keep_factor * cfg.group_size)
        return [wide if p < explored else cfg.group_size for p in range(cfg.prompts_per_iteration)]

    def _on_done(self, request_id: str, kind: str) -> None:
        if kind == "rollout":
            self.pending["rollout"] -= 1
            if self.pending["rollout"] == 0:
                self.rollout_done.succeed()

    def _record_requests(self, requests: list[dict], k: int, arm: str | None) -> None:
        finished = self.cluster.work.finished
        for i, r in enumerate(requests):
            rid = r["request_id"]
            worker, attempts, enq, fin = finished.get(rid, (None, 0, self.cluster.enqueued_at.get(rid), None))
            self.books.add(
                "requests",
                request_id=rid,
                iteration=k,
                kind=r["kind"],
                prompt=re.search(r"-(p\d+)", rid).group(1),
                seed=i,
                weights_version=k,
                worker_id=worker,
                attempts=attempts,
                enqueued_at=enq,
                finished_at=fin,
                arm=arm,
                status="done" if fin is not None else "cancelled",
            )

    def _start_exploration(self, k: int, seg: IterationTimes):
        """The real bandit's arm within the predicted training time, sized to the workers alive now; no arm that
        fits means random seeds (the phase still runs, as the real one does)."""
        budget = predict_budget_s(self.train_history)
        workers = max(1, self.cluster.alive_workers())
        choice = self.bandit.choose(budget, self.config.prompts_per_iteration, workers)
        requests = []
        if choice.arm is not None:
            level = CACHE_LEVELS[choice.arm.cache_level].nominal_cost
            measured = _given(seg.explore_request_s, self.times.explore_request_s)
            step_s = (
                measured / self.times.num_steps if measured else self.times.step_s * choice.arm.seeds_per_prompt * level
            )
            payload = {
                "steps": self.times.num_steps,
                "step_s": step_s,
                "claim_s": _given(seg.claim_s, self.times.claim_s),
            }
            requests = [
                {"request_id": f"explore-it{k}-p{p}", "iteration": k, "kind": "explore", "payload": payload}
                for p in range(self.config.prompts_per_iteration)
            ]
            self._put(requests)
        return choice, requests, budget, workers

    def _end_exploration(self, k: int, started, explore_start: float, train_s: float) -> None:
        """Cancel what is left and time the arm as the real coordinator does: the finished requests' compute
        seconds, or (none finished) the training time on every worker for one prompt."""
        choice, requests, budget, workers = started
        for queue in self.queues.values():
            queue.cancel_iteration(k, "explore")
        self.books.phase(k, "explore", explore_start, self.env.now)
        if choice.arm is None:
            self.books.add(
                "exploration",
                iteration=k,
                arm="none",
                budget_s=budget or 0.0,
                time_used_s=0.0,
                num_requests=0,
                seeds_per_prompt=None,
                cache_level=None,
                overhead_s=0.0,
                variance_gain=None,
                ucb_score=None,
                fallback_random=False,
            )
            return
        done = [r["request_id"] for r in requests if r["request_id"] in self.cluster.work.finished]
        used = sum(self.cluster.work.compute_s[rid] for rid in done)
        if done:
            self.bandit.observe_time(choice.arm, used, len(done))
        elif train_s:
            self.bandit.observe_time(choice.arm, train_s * workers, 1)
        self.explored_share = len(done) / len(requests)
        gain = self.rng.gauss(
            VARIANCE_GAIN * (choice.arm.seeds_per_prompt / (2 * self.config.group_size)) ** 0.25, 0.15
        )
        if done:
            self.bandit.observe_gain(choice.arm, gain)
        self.books.add(
            "exploration",
            iteration=k,
            arm=choice.arm.name,
            budget_s=budget or 0.0,
            time_used_s=used / workers,
            num_requests=len(requests),
            seeds_per_prompt=choice.arm.seeds_per_prompt,
            cache_level=choice.arm.cache_level,
            overhead_s=0.0,
            variance_gain=gain if done else None,
            ucb_score=None if choice.ucb is None or choice.ucb == float("inf") else choice.ucb,
            fallback_random=not done,
        )
        self._record_requests(requests, k, choice.arm.name)


def _scratch_dir() -> str | None:
    """Where the simulated queues live: a RAM-backed folder when the OS has one. The queue commits a transaction
    per claim, heartbeat and ack (about 300k for 100 iterations on 64 GPUs); on disk that was half the wall time."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


def _given(measured: float | None, default: float) -> float:
    return default if measured is None else measured


def simulate(
    config: SimConfig,
    times: ServiceTimes,
    market: Market,
    curve: LearningCurve,
    *,
    prices: PriceTable | None = None,
    setup: Setup = Setup(),
    out_dir: Path | None = None,
    target: float | None = None,
) -> SimResult:
    """Run one simulated training run; its ledger goes to out_dir/ledger.duckdb (or a temporary file)."""
    prices = prices or load_prices()
    with tempfile.TemporaryDirectory(prefix="spotlight-sim-", dir=_scratch_dir()) as tmp:
        work = Path(tmp)
        names = list(setup.slots or [f"g{i}" for i in range(config.num_spot_gpus)])
        horizon_s = 3600.0 * 24 * 30
        events = market.events(names, duration_s=horizon_s, seed=config.seed)
        coordinator = SimCoordinator(config, times, events, curve, prices, setup, work)
        coordinator.run()
        for queue in coordinator.queues.values():
            queue.close()
        path = (out_dir or work) / "ledger.duckdb"
        if path.exists():
            path.unlink()
        path.parent.mkdir(parents=True, exist_ok=True)
        ledger = Ledger(path, prices=prices)
        record = {
            "policy": asdict(config.policy),
            "sim": {k: v for k, v in asdict(config).items() if k != "policy"},
            "market": market.name,
            "curve": curve.source,
            "model": times.model,
        }
        coordinator.books.write(
            ledger, run_id=f"sim-{config.policy.name}-{config.num_spot_gpus}", config=record, end_s=coordinator.end_s
        )
        metrics = run_metrics(ledger, coordinator, target)
        result = SimResult(config, path if out_dir else Path(""), metrics)
    return result
