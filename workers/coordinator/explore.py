"""The coordinator's side of seed exploration: review a plan, start exploring beside training, finish when training ends.

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

from resources.keys import bandit_state_key, exploration_key, explore_result_key, rollout_key
from resources.store.base import TensorStore
from workers.algo.bandit import Arm
from workers.algo.seeds import candidate_seeds
from workers.explore.request import ExploreSpec
from workers.explore.seed_plan import SeedPlan, load_seed_plan, plan_from_exploration, publish_seed_plan
from workers.explore.state import ExplorationState, ExploreConfig, Review, explored_variance, review_rollout
from workers.task.prompt_file import prompt_fields, train_prompts
from workers.trainer.grpo_trainer import TrainConfig

STATE_NAME = "state.json"
SESSION_NAME = "session.json"


def explore_request_id(iteration: int, prompt_index: int) -> str:
    """`explore-it3-p5`: exploration during iteration 3's training of iteration 4's prompt 5."""
    return f"explore-it{iteration}-p{prompt_index}"


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


def load_state(store: TensorStore, run: str, config: ExploreConfig, group_size: int) -> ExplorationState:
    """The run's exploration state (a fresh one on the first iteration)."""
    key = bandit_state_key(run)
    if store.read_manifest(key) is None:
        return ExplorationState.new(config, group_size)
    state = ExplorationState.from_dict(json.loads(store.load_bytes(key, STATE_NAME)))
    if [a.name for a in state.bandit.arms] != [a.name for a in config.arms(group_size)]:
        raise ValueError(
            f"run {run!r} explored with arms {[a.name for a in state.bandit.arms]}, not "
            f"{[a.name for a in config.arms(group_size)]}: was it resumed with another configuration?"
        )
    return state


def save_state(store: TensorStore, run: str, state: ExplorationState) -> None:
    store.publish(bandit_state_key(run), {STATE_NAME: json.dumps(state.to_dict(), sort_keys=True).encode()})


def explored_prompts(config: TrainConfig, explore_config: ExploreConfig | None, iteration: int) -> list[int]:
    """Indices of iteration+1's prompts that exploration samples: all but the plan's control prompts."""
    controls = (
        set() if explore_config is None else set(explore_config.controls(iteration + 1, config.prompts_per_iteration))
    )
    return [i for i in range(config.prompts_per_iteration) if i not in controls]


def explore_requests(
    config: TrainConfig, run: str, iteration: int, arm: Arm, explore_config: ExploreConfig | None = None
) -> list[dict]:
    """Queue requests exploring iteration+1's prompts on weights v(iteration): one per explored prompt (every prompt
    but the control prompts of `explore_config`), M candidates, in prompt order."""
    prompts = train_prompts(config, iteration + 1)
    keep = set(explored_prompts(config, explore_config, iteration))
    out = []
    for i, prompt in enumerate(prompts):
        if i not in keep:
            continue
        seeds = candidate_seeds(config.seed, iteration + 1, i, config.group_size, arm.seeds_per_prompt)
        spec = ExploreSpec(
            run,
            prompt,
            tuple(seeds),
            iteration,
            config.sampler,
            arm.cache_level,
            config.reward,
            prompt_fields(config.prompts, prompt) or None,
        )
        out.append(
            {
                "request_id": explore_request_id(iteration, i),
                "iteration": iteration,
                "kind": "explore",
                "payload": spec.to_payload(),
            }
        )
    return out


def review_iteration(
    store: TensorStore, run: str, config: TrainConfig, iteration: int, explore_config: ExploreConfig
) -> Review:
    """Judge the plan iteration `iteration` sampled with on its committed rollout results; update the state."""
    plan = load_seed_plan(store, run, iteration)
    state = load_state(store, run, explore_config, config.group_size)
    review = review_rollout(
        state, explore_config, iteration, plan, real_rewards(store, run, plan), group_size=config.group_size
    )
    save_state(store, run, state)
    return review


def real_rewards(store: TensorStore, run: str, plan: SeedPlan) -> list[list[float]]:
    """real[i][j]: the committed rollout reward of plan.seeds[i][j] (LookupError for one not committed)."""
    from workers.coordinator.rollout import request_id

    k, real = plan.iteration, []
    for i, group in enumerate(plan.seeds):
        rewards = []
        for j, seed in enumerate(group):
            manifest = store.read_manifest(rollout_key(run, k, request_id(k, i, j)))
            if manifest is None or manifest.metadata.get("seed") != seed:
                raise LookupError(f"iteration {k}: no committed rollout of prompt {i} with planned seed {seed}")
            rewards.append(float(manifest.metadata["reward"]))
        real.append(rewards)
    return real


def seed_groups(store: TensorStore, run: str, config: TrainConfig, iteration: int, review: Review) -> list[dict]:
    """The ledger's `seed_groups` rows of iteration's rollout, as `review` judged it (workers/explore/payoff.py)."""
    from workers.explore.payoff import seed_group_rows
    from workers.trainer.grpo_trainer import default_seeds

    plan = load_seed_plan(store, run, iteration)
    made = iteration > 0 and store.read_manifest(exploration_key(run, iteration - 1)) is not None
    return seed_group_rows(
        plan,
        real_rewards(store, run, plan),
        review,
        config.group_size,
        default_seeds(config, iteration),
        explored_results(store, run, iteration - 1) if made else {},
    )


def start_exploration(
    store: TensorStore, queue, run: str, config: TrainConfig, iteration: int, explore_config: ExploreConfig
) -> Session:
    """Choose the arm and enqueue iteration+1's exploration requests (a session already started is reused)."""
    key = exploration_key(run, iteration)
    if store.read_manifest(key) is not None:  # a redone iteration: the same requests, same arm
        session = load_session(store, run, iteration)
    else:
        state = load_state(store, run, explore_config, config.group_size)
        num_explored = max(1, len(explored_prompts(config, explore_config, iteration)))
        choice = state.bandit.choose(state.budget_s(), num_explored, explore_config.num_workers)
        session = Session(
            iteration,
            None if choice.arm is None else choice.arm.name,
            state.budget_s(),
            choice.predicted_s,
            choice.ucb,
            choice.reason,
            started_at=time.time(),
            num_workers=explore_config.num_workers,
        )
        if choice.arm is not None:
            requests = explore_requests(config, run, iteration, choice.arm, explore_config)
            session.request_ids = [r["request_id"] for r in requests]
            session.prompt_indices = explored_prompts(config, explore_config, iteration)
        publish_session(store, run, session)
    if session.arm is not None:
        known = set(session.request_ids)  # ids already on the queue are skipped
        queue.put([r for r in explore_requests(config, run, iteration, session.arm_spec) if r["request_id"] in known])
    return session


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
    cancelled = queue.cancel_iteration(iteration, kind="explore") if session.request_ids else 0
    done = queue.results(session.request_ids) if session.request_ids else {}
    results, finished_at, worker_ids, compute_s = {}, {}, {}, 0.0
    for i, meta in _committed_results(store, run, session, done).items():
        results[i] = ([int(s) for s in meta["seeds"]], [float(r) for r in meta["rewards"]])
        finished_at[i], worker_ids[i] = float(meta.get("finished_at", 0.0)), str(meta.get("worker_id"))
        compute_s += float(meta.get("compute_s", 0.0))
    if session.arm is not None and results:
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
        compute_s / session.num_workers,
        explored_variance([r for _, r in results.values()]),
        time.perf_counter() - started,
        results,
        finished_at,
        worker_ids,
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


def next_plan(
    config: TrainConfig,
    iteration: int,
    arm: str | None,
    state: ExplorationState,
    results: dict[int, tuple[list[int], list[float]]],
    explore_config: ExploreConfig | None = None,
) -> SeedPlan:
    """The plan of `iteration` from what exploration finished; its planner says why it is random when it is.
    An explored plan keeps the arm's W seeds per contested prompt and names `explore_config`'s control prompts."""
    if arm is None:
        return plan_from_exploration(config, iteration, {}, "random:no-arm-fits-budget", use_exploration=False)
    if state.fallback:
        return plan_from_exploration(
            config, iteration, results, f"random:fallback-tau-{state.last_kendall_tau:.2f}", use_exploration=False
        )
    if not results:
        return plan_from_exploration(config, iteration, {}, "random:nothing-explored-in-time", use_exploration=False)
    ec = explore_config or ExploreConfig()
    return plan_from_exploration(
        config,
        iteration,
        results,
        f"explore:{arm}",
        keep=Arm.parse(arm).kept(config.group_size),
        controls=tuple(ec.controls(iteration, config.prompts_per_iteration)),
        min_contest_std=ec.min_contest_std,
    )


def load_session(store: TensorStore, run: str, iteration: int) -> Session:
    key = exploration_key(run, iteration)
    if store.read_manifest(key) is None:
        raise LookupError(
            f"run {run!r} has no exploration session for iteration {iteration} ({store.url}/{key}): "
            f"materialize iteration {iteration}'s exploration first"
        )
    return Session(**json.loads(store.load_bytes(key, SESSION_NAME)))


def exploration_record(finished: Finished):
    """The ledger's `exploration` row of the iteration (rank consistency and gain come one iteration later)."""
    import math

    from resources.ledger.records import ExplorationRecord

    s, arm = finished.session, finished.session.arm_spec
    return ExplorationRecord(
        iteration=s.iteration,
        arm=s.arm or "none",
        budget_s=s.budget_s or 0.0,
        time_used_s=finished.time_used_s,
        num_requests=finished.num_done,
        reward_variance=finished.reward_variance,
        ucb_score=None if s.ucb is None or math.isinf(s.ucb) else s.ucb,
        seeds_per_prompt=None if arm is None else arm.seeds_per_prompt,
        cache_level=None if arm is None else arm.cache_level,
        overhead_s=finished.overhead_s,
        fallback_random=finished.plan.planner.startswith("random:fallback"),
    )


def with_review(record, review: Review):
    """The row of the iteration that made the plan, completed by the monitor's verdict on its rollout."""
    import dataclasses

    return dataclasses.replace(
        record,
        rank_consistency=review.concordance,
        kendall_tau=review.kendall_tau,
        spearman_rho=review.spearman_rho,
        variance_gain=review.variance_gain,
    )


def explore_request_records(
    finished: Finished, config: TrainConfig, run: str, enqueued_at: float | None = None
) -> list:
    """One ledger `requests` row per exploration request: done (reward = mean explored reward) or cancelled."""
    from resources.ledger.records import RequestRecord

    s = finished.session
    if s.arm is None:
        return []
    prompts = train_prompts(config, s.iteration + 1)
    rows = []
    for i, rid in zip(s.prompt_indices, s.request_ids, strict=False):
        seeds = candidate_seeds(config.seed, s.iteration + 1, i, config.group_size, s.arm_spec.seeds_per_prompt)
        done = finished.results.get(i)
        rows.append(
            RequestRecord(
                request_id=rid,
                iteration=s.iteration,
                kind="explore",
                prompt=prompts[i],
                seed=seeds[0],
                weights_version=s.iteration,
                worker_id=finished.worker_ids.get(i),
                attempts=1,
                status="done" if done else "cancelled",
                reward=None if done is None else sum(done[1]) / len(done[1]),
                enqueued_at=enqueued_at or s.started_at,
                finished_at=finished.finished_at.get(i),
                arm=s.arm,
            )
        )
    return rows
