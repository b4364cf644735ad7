"""Did exploration pay for itself? Per prompt of a rollout: where its seeds came from, what variance they realised.

One row per prompt of iteration k's rollout (the ledger's `seed_groups`, summed per iteration
by the view `exploration_payoff`): whether exploration chose its seeds or they are the default
(random) ones, the real reward variance of the group the trainer kept, the random-seed
baseline the bandit judged it against, and, on exploration's stale, cheap rewards of the same
prompt, the variance of the chosen seeds against that of the prompt's default seeds (the
candidates start with them, so the comparison is on equal terms where the prompt was explored).

Example:
    review = review_rollout(state, config, k, plan, real, group_size=8)
    rows = seed_group_rows(plan, real, review, 8, default_seeds(train_config, k), explored_results)
"""

from __future__ import annotations

import numpy as np

from workers.explore.seed_plan import SeedPlan
from workers.explore.state import Review, trained_variance


def seed_group_rows(
    plan: SeedPlan,
    real_rewards: list[list[float]],
    review: Review,
    group_size: int,
    default_groups: list[list[int]],
    explored: dict[int, tuple[list[int], list[float]]] | None = None,
) -> list[dict]:
    """The `seed_groups` rows of `plan`'s rollout. explored: prompt index -> (candidate seeds, stale rewards) of the
    exploration that made the plan (empty for a plan no exploration made)."""
    explored = explored or {}
    stale = plan.explored_rewards or [None] * len(plan.seeds)
    rows = []
    for i, (prompt, seeds, real) in enumerate(zip(plan.prompts, plan.seeds, real_rewards, strict=False)):
        rows.append(
            {
                "iteration": plan.iteration,
                "prompt_index": i,
                "prompt": prompt,
                "planner": plan.planner,
                "source": "explored" if review.explored_prompts[i] else "random",
                "seeds": ",".join(map(str, seeds)),
                "num_drawn": len(seeds),
                "num_trained": min(len(seeds), group_size),
                "trained_variance": review.trained_variance[i],
                "drawn_variance": float(np.var(real)),
                "baseline_variance": review.random_variance,
                "stale_variance": None if stale[i] is None else trained_variance(stale[i], group_size),
                "stale_default_variance": _stale_variance_of(default_groups[i], explored.get(i), group_size),
            }
        )
    return rows


def _stale_variance_of(
    seeds: list[int], explored: tuple[list[int], list[float]] | None, group_size: int
) -> float | None:
    """Variance of the stale rewards of `seeds` as the trainer would keep them
    (None where they were not all explored)."""
    if explored is None:
        return None
    by_seed = dict(zip(*explored, strict=False))
    if not all(s in by_seed for s in seeds):
        return None
    return trained_variance([by_seed[s] for s in seeds], group_size)
