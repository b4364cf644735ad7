"""Seed exploration run by the coordinator itself, on a budget counted in samples: a spot pool made deterministic.

On a spot pool (`spotlight run`), exploration of iteration k+1's seeds runs on idle
workers while the trainer turns v(k) into v(k+1), and how much of it finishes depends on
the machine's timing: two runs of one seed differ. To measure what exploration does to
*learning*, this module runs the same exploration in process, after the update, on the
same stale weights v(k), with the pool's capacity given as a budget of full-sampler
samples per iteration (`Sampling.explore_samples`). An arm's cost per prompt is its
candidates times the cache level's cost per sample (`UCBBandit.work_units`: the step
share, or a cache hook's measured nominal cost), so the bandit sees exact costs, the
prompts that fit the budget are explored in order, and the run is a function of its seed.

What the in-process exploration costs in this process is not on any critical path: on a
pool it runs beside training. The ledger's exploration row counts its budget and use in
samples (`budget_s` and `time_used_s` hold samples here; `reason` says so).

Example:
    finished = explore_in_process(store, "demo", config, k, ExploreConfig(), budget_samples=128)
    finished.plan.planner, finished.num_done, finished.time_used_s   # samples spent
"""

from __future__ import annotations

import time

from resources.keys import exploration_key, explore_result_key
from resources.store.base import TensorStore
from workers.explore.planning import explore_requests, explored_prompts, load_state, next_plan, save_state
from workers.explore.request import ExploreSpec, commit_explore_result, explore_rewards
from workers.explore.seed_plan import publish_seed_plan
from workers.explore.session import Finished, Session, load_session, publish_session
from workers.explore.state import ExploreConfig, explored_variance
from workers.trainer.grpo_trainer import TrainConfig
from workers.trainer.resident import resident_checkpoint

WORKER_ID = "coordinator"
"""Who the results say explored them."""


def explore_in_process(
    store: TensorStore,
    run: str,
    config: TrainConfig,
    iteration: int,
    explore_config: ExploreConfig,
    budget_samples: float,
    device: str = "cpu",
) -> Finished:
    """Explore iteration+1's prompts on weights v(iteration) within `budget_samples`; publish iteration+1's plan."""
    if not budget_samples > 0:
        raise ValueError(f"budget_samples must be > 0, got {budget_samples}")
    state = load_state(store, run, explore_config, config.group_size)
    session = _session(store, run, config, iteration, state, budget_samples, explore_config)
    arm = session.arm_spec
    requests = [] if arm is None else explore_requests(config, run, iteration, arm, explore_config)
    results: dict[int, tuple[list[int], list[float]]] = {}
    spent = 0.0
    if requests:
        per_prompt = state.bandit.work_units(arm)
        # What the pool finishes before training ends (the small tolerance: an arm costing exactly the budget fits).
        fit = list(zip(session.prompt_indices, requests, strict=False))[: int(budget_samples / per_prompt + 1e-9)]
        results = _explore(store, run, iteration, fit, device, per_prompt, config.rollout_batch)
        spent = per_prompt * len(results)
        if results:
            state.record_time(iteration, arm, spent, len(results))
    plan = next_plan(config, iteration + 1, session.arm, state, results, explore_config)
    publish_seed_plan(store, run, plan)
    save_state(store, run, state)
    now = time.time()
    return Finished(
        session,
        plan,
        len(results),
        len(requests) - len(results),
        spent,
        explored_variance([r for _, r in results.values()]),
        0.0,
        results,
        {i: now for i in results},
        {i: WORKER_ID for i in results},
    )


def _session(
    store: TensorStore,
    run: str,
    config: TrainConfig,
    iteration: int,
    state,
    budget_samples: float,
    explore_config: ExploreConfig,
) -> Session:
    """The bandit's choice for this iteration, committed (a redone iteration reuses the committed one). Costs in
    samples are exact, so an arm fits when it costs at most the budget (no safety margin)."""
    if store.read_manifest(exploration_key(run, iteration)) is not None:
        return load_session(store, run, iteration)
    indices = explored_prompts(config, explore_config, iteration)
    choice = state.bandit.choose(budget_samples, max(1, len(indices)), 1, unit_cost=1.0)
    session = Session(
        iteration,
        None if choice.arm is None else choice.arm.name,
        budget_samples,
        choice.predicted_s,
        choice.ucb,
        f"{choice.reason} (budget counted in samples)",
        started_at=time.time(),
    )
    if choice.arm is not None:
        session.request_ids = [
            r["request_id"] for r in explore_requests(config, run, iteration, choice.arm, explore_config)
        ]
        session.prompt_indices = indices
    publish_session(store, run, session)
    return session


def _explore(
    store: TensorStore,
    run: str,
    iteration: int,
    requests: list[tuple[int, dict]],
    device: str,
    per_prompt: float,
    chunk: int | None = None,
) -> dict[int, tuple[list[int], list[float]]]:
    """Prompt index -> (candidate seeds, explored rewards) of (prompt index, request) pairs, each committed where a
    worker would commit it; each request sampled `chunk` seeds at a time (None: whole)."""
    if not requests:
        return {}
    policy, _ = resident_checkpoint(store, run, iteration, device)  # the stale weights v(iteration), in place
    out = {}
    for i, request in requests:
        spec = ExploreSpec.from_payload(request["payload"])
        rewards = explore_rewards(policy, spec, chunk)
        key = explore_result_key(run, iteration, request["request_id"])
        if store.read_manifest(key) is None:  # a redone iteration keeps its first commit
            commit_explore_result(store, key, spec, rewards, compute_s=per_prompt, worker_id=WORKER_ID)
        out[i] = (list(spec.seeds), rewards)
    return out
