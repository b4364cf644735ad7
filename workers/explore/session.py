"""A seed-exploration session beside training: review a plan, start exploring beside training,
finish when training ends.

Iteration k, in the order the pipeline runs them:

1. `review_iteration` (after the rollout of k): the monitor judges the plan k sampled with
   (rank consistency, variance gain) and feeds the bandit.
2. `start_exploration` (before training starts): the bandit picks an arm whose predicted
   time fits the predicted training time; one low-priority `explore` request per prompt of
   iteration k+1 goes on the queue, on weights v(k). Idle workers pick them up once no
   rollout or validation request is waiting.
3. `finish_exploration` (as soon as training ends): exploration requests still pending or
   running are cancelled, never waited for; the plan of k+1 is made from whatever finished
   (unexplored prompts keep random seeds) and published. So exploration never holds up the
   next iteration's sync: what it adds to the critical path is this call's own few milliseconds.

With `ExploreConfig.budget_samples` the stop is a request budget instead of the wall clock: step 2
plans the arm and the requests that fit the budget in samples and records them in the session;
step 3 waits for exactly those, however slow the workers are while they make progress (it gives up only after
`budget_wait_s` without one finishing), so the plan is a function of the run's seed, not of how fast the workers
were (the wait, if any, is the call's `overhead_s`).

The state (bandit, budget history, baseline, fallback flag) lives at `bandit_state_key`,
each session at `exploration_key(run, k)`, each result at `explore_result_key`.

Example:
    review = review_iteration(store, "demo", config, k, explore_config)
    session = start_exploration(store, queue, "demo", config, k, explore_config)
    ... training ...
    finished = finish_exploration(store, queue, "demo", config, k, explore_config, train_s=41.0)
    finished.plan.planner, finished.num_done, finished.overhead_s

"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from resources.keys import exploration_key, explore_result_key
from resources.store.base import TensorStore
from workers.algo.bandit import Arm
from workers.explore.planning import explore_requests, explored_prompts, load_state, next_plan, save_state
from workers.explore.seed_plan import SeedPlan, publish_seed_plan
from workers.explore.state import ExploreConfig, explored_variance
from workers.trainer.grpo_trainer import TrainConfig

SESSION_NAME = "session.json"


@dataclass
class Session:
    """One iteration's exploration, as started (kept in the store for the finishing step, maybe another process)."""

    iteration: int
    arm: str | None
    """Arm name, or None when no arm fit the budget (no requests)."""
    budget_s: float | None
    predicted_s: float | None
    ucb: float | None
    reason: str
    request_ids: list[str] = field(default_factory=list)
    prompt_indices: list[int] = field(default_factory=list)
    started_at: float = 0.0
    num_workers: int = 1

    @property
    def arm_spec(self) -> Arm | None:
        return None if self.arm is None else Arm.parse(self.arm)


@dataclass
class Finished:
    """What one iteration's exploration produced."""

    session: Session
    plan: SeedPlan
    num_done: int
    num_cancelled: int
    time_used_s: float
    """Worker-seconds of the finished requests over the workers: the same units as the budget."""
    reward_variance: float | None
    """Mean within-prompt variance of the explored rewards over all candidates."""
    overhead_s: float
    """Seconds this call took: what exploration added to the critical path."""
    results: dict[int, tuple[list[int], list[float]]] = field(default_factory=dict)
    """Prompt index -> (candidate seeds, explored rewards) of the finished requests."""
    finished_at: dict[int, float] = field(default_factory=dict)
    worker_ids: dict[int, str] = field(default_factory=dict)
    num_missing: int = 0
    """On a budget in requests: planned requests without a result when the plan was made (0 unless no worker
    finished one for `budget_wait_s`; the plan then depends on timing, and the seed plan phase says so)."""


def start_exploration(
    store: TensorStore, queue, run: str, config: TrainConfig, iteration: int, explore_config: ExploreConfig
) -> Session:
    """Choose the arm and enqueue iteration+1's exploration requests (a session already started is reused)."""
    key = exploration_key(run, iteration)
    if store.read_manifest(key) is not None:  # a redone iteration: the same requests, same arm
        session = load_session(store, run, iteration)
    else:
        session = _new_session(store, run, config, iteration, explore_config)
        publish_session(store, run, session)
    if session.arm is not None:
        known = set(session.request_ids)  # ids already on the queue are skipped
        queue.put([r for r in explore_requests(config, run, iteration, session.arm_spec) if r["request_id"] in known])
    return session


def _new_session(
    store: TensorStore, run: str, config: TrainConfig, iteration: int, explore_config: ExploreConfig
) -> Session:
    """The bandit's arm and the requests to enqueue: all explored prompts within the predicted training time, or,
    with a budget in samples, the first prompts whose work fits it (exact costs, no safety margin)."""
    state = load_state(store, run, explore_config, config.group_size)
    indices = explored_prompts(config, explore_config, iteration)
    budget = explore_config.budget_samples
    if budget is None:
        choice = state.bandit.choose(state.budget_s(), max(1, len(indices)), explore_config.num_workers)
    else:
        choice = state.bandit.choose(budget, max(1, len(indices)), 1, unit_cost=1.0)
    session = Session(
        iteration,
        None if choice.arm is None else choice.arm.name,
        state.budget_s() if budget is None else budget,
        choice.predicted_s,
        choice.ucb,
        choice.reason if budget is None else f"{choice.reason} (budget counted in samples)",
        started_at=time.time(),
        num_workers=explore_config.num_workers,
    )
    if choice.arm is not None:
        requests = explore_requests(config, run, iteration, choice.arm, explore_config)
        planned = len(requests)
        if budget is not None:  # the tolerance: an arm costing exactly the budget fits
            planned = min(planned, int(budget / state.bandit.work_units(choice.arm) + 1e-9))
        session.request_ids = [r["request_id"] for r in requests][:planned]
        session.prompt_indices = indices[:planned]
    return session


def _wait_for_planned(queue, session: Session, stall_s: float) -> int:
    """A budget in requests: wait until every planned request has a result, however long the workers take while
    they make progress; give up only after `stall_s` without any planned request finishing (no worker is serving
    the queue). Returns how many planned requests have no result."""
    planned = len(session.request_ids)
    done, last_progress = len(queue.results(session.request_ids)), time.monotonic()
    while done < planned and time.monotonic() - last_progress < stall_s:
        time.sleep(0.05)
        now_done = len(queue.results(session.request_ids))
        if now_done > done:
            done, last_progress = now_done, time.monotonic()
    return planned - done


def finish_exploration(
    store: TensorStore,
    queue,
    run: str,
    config: TrainConfig,
    iteration: int,
    explore_config: ExploreConfig,
    train_s: float | None = None,
) -> Finished:
    """Training has ended: cancel what is left, plan iteration+1 from what finished, publish the plan."""
    started = time.perf_counter()
    session = load_session(store, run, iteration)
    state = load_state(store, run, explore_config, config.group_size)
    if train_s is not None:
        state.record_train_s(iteration, train_s)
    in_samples = explore_config.budget_samples is not None
    missing = 0
    if in_samples and session.request_ids:
        missing = _wait_for_planned(queue, session, explore_config.budget_wait_s)
    cancelled = queue.cancel_iteration(iteration, kind="explore") if session.request_ids else 0
    done = queue.results(session.request_ids) if session.request_ids else {}
    results, finished_at, worker_ids, compute_s = {}, {}, {}, 0.0
    for i, meta in _committed_results(store, run, session, done).items():
        results[i] = ([int(s) for s in meta["seeds"]], [float(r) for r in meta["rewards"]])
        finished_at[i], worker_ids[i] = float(meta.get("finished_at", 0.0)), str(meta.get("worker_id"))
        compute_s += float(meta.get("compute_s", 0.0))
    if in_samples and session.arm is not None:
        compute_s = state.bandit.work_units(session.arm_spec) * len(results)  # samples: the budget's unit
        if results:
            state.record_time(iteration, session.arm_spec, compute_s, len(results))
    elif session.arm is not None and results:
        state.record_time(iteration, session.arm_spec, compute_s, len(results))
    elif session.arm is not None and train_s:
        # Not one prompt finished while training ran: the arm costs at least the phase per prompt and worker.
        state.record_time(iteration, session.arm_spec, train_s * session.num_workers, 1)
    plan = next_plan(config, iteration + 1, session.arm, state, results, explore_config)
    publish_seed_plan(store, run, plan)
    save_state(store, run, state)
    return Finished(
        session,
        plan,
        len(results),
        cancelled,
        compute_s if in_samples else compute_s / session.num_workers,
        explored_variance([r for _, r in results.values()]),
        time.perf_counter() - started,
        results,
        finished_at,
        worker_ids,
        missing,
    )


def publish_session(store: TensorStore, run: str, session: Session) -> None:
    """Commit the session: the finishing step (maybe another process) and later reviews read it."""
    store.publish(
        exploration_key(run, session.iteration), {SESSION_NAME: json.dumps(asdict(session), sort_keys=True).encode()}
    )


def _committed_results(store: TensorStore, run: str, session: Session, done) -> dict[int, dict]:
    """Prompt index -> result metadata of the session's requests in `done` that committed a result."""
    out = {}
    for i, rid in zip(session.prompt_indices, session.request_ids, strict=False):
        manifest = store.read_manifest(explore_result_key(run, session.iteration, rid)) if rid in done else None
        if manifest is not None:
            out[i] = manifest.metadata
    return out


def explored_results(store: TensorStore, run: str, iteration: int) -> dict[int, tuple[list[int], list[float]]]:
    """Prompt index -> (candidate seeds, explored rewards) of every request of iteration's exploration that
    committed a result (also those finished after the plan was made)."""
    session = load_session(store, run, iteration)
    return {
        i: ([int(s) for s in meta["seeds"]], [float(r) for r in meta["rewards"]])
        for i, meta in _committed_results(store, run, session, set(session.request_ids)).items()
    }


def load_session(store: TensorStore, run: str, iteration: int) -> Session:
    key = exploration_key(run, iteration)
    if store.read_manifest(key) is None:
        raise LookupError(
            f"run {run!r} has no exploration session for iteration {iteration} ({store.url}/{key}): "
            f"materialize iteration {iteration}'s exploration first"
        )
    return Session(**json.loads(store.load_bytes(key, SESSION_NAME)))
