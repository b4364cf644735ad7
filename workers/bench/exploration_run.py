"""`spotlight bench exploration`, the seconds factor: a strategy's critical-path seconds per iteration on the pipeline.

Each run is a real pipeline run in a scratch folder: the coordinator's phases
(workers/coordinator/driver.py) in this process, a pool of rollout worker processes
pulling from a SQLite queue (no preemptions), checkpoints and seed plans in the store.
Strategies, all on the same preset, prompts and workers:

- `random`: every group samples its default request seeds, exploration off;
- `explore`: SPOTLIGHT: while the trainer updates v(k) -> v(k+1), the idle workers score
  M candidates per prompt of iteration k+1 on the stale v(k) with the arm the bandit
  picks; when the update ends, what is left is cancelled and the plan made from what
  finished; the monitor judges it on the next rollout;
- `wider_draw`: the contrast on the critical path: n x G seeds per prompt at full quality
  on the current weights, the G of largest reward variance trained.

The critical path of an iteration is what the trainer waits for, in wall seconds: sync,
rollout, train, and the coordinator's exploration work (the review and enqueue before
training, the cancel and plan after it); validation and the report are measurement and
are left out. How many iterations each strategy needs is measured apart, deterministically
(workers/bench/exploration_learning.py): here the workers' timing decides what exploration
finishes, so a run is not a function of its seed.

Example:
    record = run_strategy("explore", seed=0, config=config, explore_config=explore_config, checkpoint=base,
                          num_workers=1, validate_every=3, audit_prompts=1)
    record["curve"], record["iterations"][3]["kendall_tau"]
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Callable

from workers.algo.rank_consistency import kendall_tau_b, spearman_rho
from workers.bench.exploration_learning import STRATEGIES
from workers.coordinator.context import RunContext, Sampling
from workers.coordinator.driver import FINAL_PHASES, ITERATION_PHASES
from workers.coordinator.phases import PhaseResult
from workers.trainer.grpo_trainer import TrainConfig

CRITICAL_PHASES = ("weight_patch", "rollouts", "exploration", "policy_update", "seed_plan")
"""The phases the trainer waits for (validation and the report are measurement)."""
clock = time.perf_counter
"""Wall seconds: workers sample and explore in other processes while this one waits or trains."""


def audit_ranking(policy, config: TrainConfig, iteration: int, results: dict, num_prompts: int) -> list[dict]:
    """Kendall tau / Spearman rho of explored (stale, cheap) rewards against fresh full-quality rewards of
    *all* candidates of a few prompts: the monitor only sees the planned seeds, a biased sample."""
    from workers.algo.sampler import rollout
    from workers.task.prompt_file import train_prompts
    from workers.task.render import to_uint8
    from workers.task.rewards import get_reward

    out = []
    for i in sorted(results)[:num_prompts]:
        seeds, explored = results[i]
        prompt = train_prompts(config, iteration)[i]
        traj = rollout(policy, [prompt] * len(seeds), seeds, config.sampler)
        fresh = [float(r) for r in get_reward(config.reward)(to_uint8(traj.images), [prompt] * len(seeds))]
        out.append({"kendall_tau": kendall_tau_b(explored, fresh), "spearman_rho": spearman_rho(explored, fresh)})
    return out


def strategy_config(strategy: str, seed: int, config: TrainConfig, validate_every: int, wider_draw: int) -> TrainConfig:
    """The run's TrainConfig: wider_draw draws n x G per prompt (the trainer's wide draw), the others G."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose one of {STRATEGIES}")
    wide = wider_draw * config.group_size if strategy == "wider_draw" else None
    return dataclasses.replace(config, seed=seed, validate_every=validate_every, rollouts_per_prompt=wide)


def run_strategy(
    strategy: str,
    seed: int,
    config: TrainConfig,
    explore_config,
    *,
    checkpoint,
    num_workers: int,
    validate_every: int,
    wider_draw: int = 2,
    audit_prompts: int = 1,
    progress: Callable[[dict], None] | None = None,
) -> dict:
    """One training run from the checkpoint on the pipeline's phases; per-iteration figures and the validation
    curve on critical-path seconds."""
    from workers.coordinator.worker_pool import worker_pool

    config = strategy_config(strategy, seed, config, validate_every, wider_draw)
    with tempfile.TemporaryDirectory(prefix=f"spotlight-bench-{strategy}-") as tmp:
        run_dir = Path(tmp)
        local = RunContext.local(
            run_dir, f"bench-{strategy}-{seed}", "bench", config, checkpoint=str(checkpoint), report=False
        )
        ctx = dataclasses.replace(
            local,
            queue_url=str(run_dir / "queue.db"),
            explore_config=explore_config,
            sampling=Sampling(mode="workers", explore=strategy == "explore", num_workers=num_workers),
        )
        try:
            with worker_pool(ctx, num_workers, preemptions_per_hour=0.0, log_dir=run_dir / "worker_logs"):
                rows, curve = _walk(ctx, strategy, audit_prompts, progress)
        finally:
            ctx.ledger.close()
    return {"strategy": strategy, "seed": seed, "iterations": rows, "curve": curve}


def _walk(ctx: RunContext, strategy: str, audit_prompts: int, progress) -> tuple[list, list]:
    """Every iteration's phases in order, timed; the rows and validation curve of the run."""
    rows, curve, critical = [], [], 0.0
    for k in range(ctx.num_iterations + 1):
        results, walls = {}, {}
        for name, phase in ITERATION_PHASES:
            if ctx.is_final(k) and name not in FINAL_PHASES:
                continue
            started = clock()
            results[name] = phase(ctx, k)
            walls[name] = clock() - started
        score = results["validation"].metadata.get("score")
        if score is not None:
            curve.append({"version": k, "critical_s": round(critical, 3), "score": score})
        if ctx.is_final(k):
            break
        row = _row(ctx, k, strategy, results, walls)
        if strategy == "explore":
            row["audit"] = _audit(ctx, k, audit_prompts)
        critical += sum(walls.get(name, 0.0) for name in CRITICAL_PHASES)
        row["critical_s"] = critical
        if score is not None:
            row["validation_score"] = score
        rows.append({key: round(v, 6) if isinstance(v, float) else v for key, v in row.items()})
        if progress is not None:
            progress({"strategy": strategy, "seed": ctx.train.seed, **rows[-1]})
    return rows, curve


def _row(ctx: RunContext, k: int, strategy: str, results: dict[str, PhaseResult], walls: dict[str, float]) -> dict:
    """One iteration's figures from its phases' results."""
    train, plan_meta = results["policy_update"].record, results["seed_plan"].metadata
    review = results["exploration"].metadata
    row = {
        "iteration": k,
        "planner": results["rollouts"].metadata["planner"] if strategy == "explore" else strategy,
        "sync_s": walls["weight_patch"],
        "rollout_s": walls["rollouts"],
        "train_s": walls["policy_update"],
        "overhead_s": walls["exploration"] + walls["seed_plan"],
        "reward_mean": train["reward_mean"],
        "reward_std": train["reward_std"],
        "zero_std_ratio": train["zero_std_ratio"],
        "loss": train.get("loss"),
    }
    if strategy == "explore":
        arm = plan_meta.get("arm")
        row.update(
            kendall_tau=review.get("kendall_tau"),
            spearman_rho=review.get("spearman_rho"),
            variance_gain=review.get("variance_gain"),
            arm=None if arm == "none" else arm,
            reason=results["exploration"].metadata.get("reason"),
            budget_s=plan_meta.get("budget_s"),
            explore_wall_s=plan_meta.get("time_used_s", 0.0),
            explored_prompts=plan_meta.get("explored_prompts", 0),
            next_planner=plan_meta["planner"],
        )
    return row


def _audit(ctx: RunContext, k: int, audit_prompts: int) -> list[dict]:
    """The rank audit of the prompts iteration k's plan took from exploration, on the fresh weights v(k+1)."""
    from workers.explore.seed_plan import load_seed_plan
    from workers.explore.session import explored_results
    from workers.trainer.checkpoint import load_checkpoint

    plan = load_seed_plan(ctx.store, ctx.run, k + 1)
    used = {i for i, r in enumerate(plan.explored_rewards or []) if r is not None}
    results = {i: r for i, r in explored_results(ctx.store, ctx.run, k).items() if i in used}
    if not results or audit_prompts == 0:
        return []
    fresh, _ = load_checkpoint(ctx.store, ctx.run, k + 1)
    return audit_ranking(fresh, ctx.train, k + 1, results, audit_prompts)
