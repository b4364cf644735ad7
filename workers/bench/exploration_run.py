"""`spotlight bench exploration`, part 2: one training run under one seed strategy, with its critical path measured.

Strategies, all on the same preset, prompts and budget:

- `random`: every group samples its default request seeds (today's behaviour);
- `explore`: SPOTLIGHT: while the trainer updates v(k) -> v(k+1), exploration workers
  score M candidates per prompt of iteration k+1 on the stale weights v(k) with the arm
  the bandit picks; when the update ends, exploration stops (unfinished prompts keep
  random seeds) and the plan is made; the monitor judges it on the next rollout;
- `best_of_n`: DanceGRPO-style best-of-N on the critical path: sample N = n x G seeds per
  prompt at full quality on the current weights, train on the G of largest reward variance.

One process plays every role in turn, so the overlap is simulated on measured CPU seconds
(one thread): exploration requests are list-scheduled on `num_workers` exploration
workers from the moment training starts, and a request whose simulated end falls after
the measured end of training is cancelled (its result unused). The critical path of an
iteration is rollout + train (+ the coordinator's exploration work for `explore`, + the
wider rollout for `best_of_n`); validation is measurement and is left out.

Example:
    record = run_strategy("explore", seed=0, config=config, bench=bench, heldout=prompts, base_score=0.29)
    record["curve"], record["iterations"][3]["kendall_tau"]
"""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Callable

from workers.task.evaluate import evaluate
from workers.explore.request import ExploreSpec, explore_rewards
from workers.algo.seeds import candidate_seeds
from workers.coordinator.explore import next_plan
from workers.explore.state import ExplorationState, ExploreConfig, review_rollout
from workers.algo.grpo import group_reward_stats
from workers.algo.rank_consistency import kendall_tau_b, spearman_rho
from workers.explore.seed_plan import default_seed_plan
from workers.trainer.grpo_trainer import GRPOTrainer, Rollouts, TrainConfig
from workers.task.prompts import iteration_prompts

STRATEGIES = ("random", "explore", "best_of_n")
clock = time.process_time
"""CPU seconds of this process: with one torch thread, the critical path's seconds, unaffected by other load."""


def best_of_n_batch(trainer: GRPOTrainer, iteration: int, per_prompt: int) -> Rollouts:
    """Sample `per_prompt` seeds per prompt at full quality, keep the G of largest reward variance per prompt
    (the trainer's own wide draw, `TrainConfig.rollouts_per_prompt`)."""
    cfg = trainer.config
    trainer.config = dataclasses.replace(cfg, rollouts_per_prompt=per_prompt)
    try:
        return trainer.collect(iteration)
    finally:
        trainer.config = cfg


def explore_beside_training(stale, state: ExplorationState, explore_config: ExploreConfig, config: TrainConfig,
                            iteration: int, train_s: float) -> tuple:
    """Explore iteration+1's prompts on the stale weights until the measured training time runs out; plan it.
    Returns (plan, info, results); info["overhead_s"] is the coordinator's work (arm choice + planning)."""
    started, budget_s = clock(), state.budget_s()
    choice = state.bandit.choose(budget_s, config.prompts_per_iteration, explore_config.num_workers)
    overhead = clock() - started
    results, free_at, spent, computed = {}, [0.0] * explore_config.num_workers, 0.0, 0
    if choice.arm is not None:
        prompts = iteration_prompts(config.seed, iteration + 1, config.prompts_per_iteration, config.train_categories)
        for i, prompt in enumerate(prompts):
            worker = min(range(len(free_at)), key=free_at.__getitem__)
            if free_at[worker] >= train_s:
                break  # every worker is past the end of training: the rest is cancelled
            seeds = candidate_seeds(config.seed, iteration + 1, i, config.group_size, choice.arm.seeds_per_prompt)
            spec = ExploreSpec("bench", prompt, tuple(seeds), iteration, config.sampler, choice.arm.cache_level, config.reward)
            t = clock()
            rewards = explore_rewards(stale, spec)
            took = clock() - t
            free_at[worker] += took
            spent, computed = spent + took, computed + 1
            if free_at[worker] <= train_s:
                results[i] = (seeds, rewards)
        state.record_time(iteration, choice.arm, spent, computed)  # cancelled requests cost their time too
    state.record_train_s(iteration, train_s)
    t = clock()
    plan = next_plan(config, iteration + 1, None if choice.arm is None else choice.arm.name, state, results)
    overhead += clock() - t
    info = {"arm": None if choice.arm is None else choice.arm.name, "reason": choice.reason, "budget_s": budget_s,
            "predicted_s": choice.predicted_s, "explore_wall_s": round(min(max(free_at), train_s), 4),
            "explored_prompts": len(results), "overhead_s": overhead, "next_planner": plan.planner}
    return plan, info, results


def audit_ranking(policy, config: TrainConfig, iteration: int, results: dict, num_prompts: int) -> list[dict]:
    """Kendall tau / Spearman rho of explored (stale, cheap) rewards against fresh full-quality rewards of
    *all* candidates of a few prompts: the monitor only sees the planned seeds, a biased sample."""
    from workers.task.render import to_uint8
    from workers.task.rewards import get_reward
    from workers.algo.sampler import rollout

    out = []
    for i in sorted(results)[:num_prompts]:
        seeds, explored = results[i]
        prompt = iteration_prompts(config.seed, iteration, config.prompts_per_iteration, config.train_categories)[i]
        traj = rollout(policy, [prompt] * len(seeds), seeds, config.sampler)
        fresh = [float(r) for r in get_reward(config.reward)(to_uint8(traj.images), [prompt] * len(seeds))]
        out.append({"kendall_tau": kendall_tau_b(explored, fresh), "spearman_rho": spearman_rho(explored, fresh)})
    return out


def run_strategy(strategy: str, seed: int, config: TrainConfig, explore_config: ExploreConfig, *, checkpoint,
                 validate_every: int, heldout: list[str], base_score: float, best_of_n: int, audit_prompts: int,
                 progress: Callable[[dict], None] | None = None) -> dict:
    """One training run from the checkpoint; per-iteration figures and the validation curve on critical-path seconds."""
    from workers.model.policy import load_policy

    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {STRATEGIES}")
    config = dataclasses.replace(config, seed=seed)
    policy = load_policy(checkpoint)
    trainer, state = GRPOTrainer(policy, config), ExplorationState.new(explore_config, config.group_size)
    plan, critical, rows = default_seed_plan(config, 0), 0.0, []
    curve = [{"version": 0, "critical_s": 0.0, "score": base_score}]
    for k in range(config.iterations):
        row = {"iteration": k, "planner": plan.planner if strategy == "explore" else strategy}
        t = clock()
        batch = best_of_n_batch(trainer, k, best_of_n * config.group_size) if strategy == "best_of_n" else \
            trainer.collect(k, seeds=plan.flat_seeds())
        row["rollout_s"] = clock() - t
        overhead = 0.0
        if strategy == "explore":
            t = clock()
            review = review_rollout(state, explore_config, k, plan, batch.rewards.view(len(plan.seeds), -1).tolist())
            overhead += clock() - t
            row.update(kendall_tau=review.kendall_tau, spearman_rho=review.spearman_rho, variance_gain=review.variance_gain)
            stale = copy.deepcopy(policy)
        t = clock()
        stats = trainer.update(batch)
        row["train_s"] = clock() - t
        if strategy == "explore":
            plan, info, results = explore_beside_training(stale, state, explore_config, config, k, row["train_s"])
            overhead += info.pop("overhead_s")
            row.update(info, audit=audit_ranking(policy, config, k + 1, results, audit_prompts))
        row["overhead_s"] = overhead
        row.update(group_reward_stats(batch.rewards, batch.group_ids), reward_mean=float(batch.rewards.mean()),
                   loss=stats.get("loss"))
        critical += row["rollout_s"] + row["train_s"] + overhead
        row["critical_s"] = critical
        if (k + 1) % validate_every == 0 or k + 1 == config.iterations:
            score = evaluate(policy, heldout, config.validation_seeds).score
            curve.append({"version": k + 1, "critical_s": round(critical, 3), "score": score})
            row["validation_score"] = score
        rows.append({key: round(v, 6) if isinstance(v, float) else v for key, v in row.items()})
        if progress is not None:
            progress({"strategy": strategy, "seed": seed, **rows[-1]})
    return {"strategy": strategy, "seed": seed, "iterations": rows, "curve": curve}
