"""Planning seed exploration: which prompts to explore, the requests, the review of a plan, the next plan.

The coordinator's exploration runs in three steps per iteration k (workers/explore/session.py
starts and finishes a session; this module holds what they plan with):

1. `review_iteration` (after the rollout of k): the monitor judges the plan k sampled with
   (rank consistency, variance gain) and feeds the bandit.
2. `explore_requests`: one low-priority `explore` request per prompt of iteration k+1, on
   weights v(k), for the arm the bandit picked.
3. `next_plan`: the plan of k+1 from whatever finished (unexplored prompts keep random seeds).

The state (bandit, budget history, baseline, fallback flag) lives at `bandit_state_key`.
"""

from __future__ import annotations

import json

from resources.keys import bandit_state_key, request_id, rollout_key
from resources.store.base import TensorStore
from workers.algo.bandit import Arm
from workers.algo.seeds import candidate_seeds
from workers.explore.request import ExploreSpec
from workers.explore.seed_plan import SeedPlan, load_seed_plan, plan_from_exploration
from workers.explore.state import ExplorationState, ExploreConfig, Review, review_rollout
from workers.task.prompt_file import prompt_fields, train_prompts
from workers.trainer.grpo_trainer import TrainConfig

STATE_NAME = "state.json"


def explore_request_id(iteration: int, prompt_index: int) -> str:
    """`explore-it3-p5`: exploration during iteration 3's training of iteration 4's prompt 5."""
    return f"explore-it{iteration}-p{prompt_index}"


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
            config.sampler_at(iteration + 1),
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
