"""Seed plans: which seeds each prompt of an iteration is sampled with, kept in the tensor store.

The explore phase of iteration k writes the plan of iteration k+1 (`seed_plan_key(run,
k+1)`); the rollout phase of iteration k+1 reads it. A plan is either the default one
(the request seeds of `workers.trainer.grpo_trainer.request_seed`, i.e. random seeds) or an explored
one (`plan_from_exploration`): for each prompt whose candidates were explored on stale
weights, the G seeds with the largest explored reward variance; prompts that were not
explored in time keep their default seeds. The plan also keeps the explored rewards of
its seeds, so the rollout can check how well stale, cheap rewards ranked them.

Example:
    plan = default_seed_plan(config, iteration=4)
    plan = plan_from_exploration(config, 4, {0: (seeds, rewards)}, planner="explore:m16-half_steps")
    publish_seed_plan(store, "demo", plan)
    plan = load_seed_plan(store, "demo", 4)
    batch = trainer.collect(4, seeds=plan.flat_seeds())
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from resources.keys import seed_plan_key
from resources.store.base import TensorStore
from workers.algo.bandit import Arm
from workers.algo.selection import select_max_variance
from workers.task.prompt_file import train_prompts
from workers.trainer.grpo_trainer import TrainConfig, default_seeds

PLAN_NAME = "seed_plan.json"


@dataclass(frozen=True)
class SeedPlan:
    """The seeds of one iteration's rollout requests, grouped by prompt."""

    iteration: int
    """Iteration whose rollouts use the plan."""
    planner: str
    """Who chose the seeds: "default" (request_seed) or an exploration arm."""
    prompts: list[str]
    """The iteration's prompts, in order."""
    seeds: list[list[int]]
    """seeds[i][j]: seed of sample j of prompt i (group_size per prompt; rollouts_per_prompt in a
    default plan of a config that sets it)."""
    explored_rewards: list[list[float] | None] | None = None
    """explored_rewards[i][j]: the stale, cheap reward of seeds[i][j] (None for a prompt not explored)."""
    control_prompts: tuple[int, ...] = ()
    """Prompts kept on their random seeds as a concurrent control (their groups measure the random baseline)."""

    def __post_init__(self) -> None:
        if len(self.prompts) != len(self.seeds):
            raise ValueError(
                f"seed plan of iteration {self.iteration}: {len(self.prompts)} prompts "
                f"but {len(self.seeds)} seed groups"
            )
        if self.explored_rewards is not None and (
            len(self.explored_rewards) != len(self.seeds)
            or any(r is not None and len(r) != len(g) for r, g in zip(self.explored_rewards, self.seeds, strict=False))
        ):
            raise ValueError(f"seed plan of iteration {self.iteration}: explored rewards do not match the seeds")
        if any(not 0 <= i < len(self.seeds) for i in self.control_prompts):
            raise ValueError(
                f"seed plan of iteration {self.iteration}: control prompts {list(self.control_prompts)} "
                f"outside its {len(self.seeds)} prompts"
            )

    @property
    def explored(self) -> bool:
        """True when exploration chose the seeds (not the default plan or a fallback to random seeds)."""
        return self.planner.startswith("explore:")

    def flat_seeds(self) -> list[int]:
        """Prompt-major seeds, the order `GRPOTrainer.collect(seeds=...)` expects."""
        return [s for group in self.seeds for s in group]

    def check_matches(self, config: TrainConfig) -> None:
        """ValueError when the plan was made for other prompts or group sizes than `config` samples."""
        expected = train_prompts(config, self.iteration)
        sizes = {config.group_size, config.rollouts_per_prompt or config.group_size}
        if self.explored:  # a pre-filter plan keeps the arm's W seeds of a contested prompt; the train phase keeps G
            sizes.add(Arm.parse(self.planner.split(":", 1)[1]).kept(config.group_size))
        if self.prompts != expected or any(len(g) not in sizes for g in self.seeds):
            raise ValueError(
                f"seed plan of iteration {self.iteration} does not match the training config "
                f"({len(self.prompts)} prompts x {[len(g) for g in self.seeds]} seeds); "
                "was the run restarted with another preset?"
            )


def default_seed_plan(config: TrainConfig, iteration: int) -> SeedPlan:
    """The unexplored plan: every prompt draws its default seeds, rollouts_per_prompt of them when the
    config sets it (the train phase keeps the group_size of largest reward variance), else group_size."""
    prompts = train_prompts(config, iteration)
    return SeedPlan(iteration, "default", prompts, default_seeds(config, iteration))


def plan_from_exploration(
    config: TrainConfig,
    iteration: int,
    explored: dict[int, tuple[list[int], list[float]]],
    planner: str,
    use_exploration: bool = True,
    keep: int | None = None,
    controls: tuple[int, ...] = (),
    min_contest_std: float = 0.0,
) -> SeedPlan:
    """The plan of `iteration` from explored candidates (prompt index -> (candidate seeds, explored rewards)).

    With `use_exploration`, an explored prompt gets the `keep` (default G) candidates of largest explored
    reward variance; a prompt whose explored rewards' std is at most `min_contest_std` (uncontested: nothing
    to choose between) keeps its G default request seeds, and a control prompt its default seeds. Otherwise
    (a fallback to random seeds) every prompt keeps its default seeds. The explored rewards of the kept seeds
    are kept where they were explored, for the monitor."""
    import numpy as np

    plan = default_seed_plan(config, iteration)
    seeds, rewards = [list(g) for g in plan.seeds], [None] * len(plan.seeds)
    width = config.group_size if keep is None else keep
    for i, (candidates, values) in sorted(explored.items()):
        if not 0 <= i < len(seeds):
            raise ValueError(f"explored prompt index {i} is outside iteration {iteration}'s {len(seeds)} prompts")
        by_seed = dict(zip(candidates, values, strict=False))
        if use_exploration and i not in controls:
            contested = float(np.std(values)) > min_contest_std
            # Uncontested: the first G candidates, i.e. the G default request seeds (workers/algo/seeds.py).
            seeds[i] = (
                select_max_variance(candidates, values, min(width, len(candidates)))
                if contested
                else list(candidates[: config.group_size])
            )
        if all(s in by_seed for s in seeds[i]):
            rewards[i] = [float(by_seed[s]) for s in seeds[i]]
    return SeedPlan(iteration, planner, plan.prompts, seeds, rewards, tuple(controls))


def publish_seed_plan(store: TensorStore, run: str, plan: SeedPlan) -> None:
    """Commit the plan (re-publishing the same plan is a no-op)."""
    data = json.dumps(asdict(plan), sort_keys=True).encode()
    store.publish(seed_plan_key(run, plan.iteration), {PLAN_NAME: data}, {"planner": plan.planner})


def load_seed_plan(store: TensorStore, run: str, iteration: int) -> SeedPlan:
    """The committed plan of `iteration` (LookupError when the explore phase has not written it)."""
    key = seed_plan_key(run, iteration)
    if store.read_manifest(key) is None:
        raise LookupError(
            f"run {run!r} has no seed plan for iteration {iteration} ({store.url}/{key}): "
            f"materialize iteration {iteration - 1}'s seed_plan first"
        )
    raw = json.loads(store.load_bytes(key, PLAN_NAME))
    rewards = raw.get("explored_rewards")  # absent in plans written before exploration existed
    return SeedPlan(
        raw["iteration"],
        raw["planner"],
        list(raw["prompts"]),
        [list(map(int, g)) for g in raw["seeds"]],
        None if rewards is None else [None if r is None else [float(x) for x in r] for r in rewards],
        tuple(int(i) for i in raw.get("control_prompts", ())),
    )


def plan_for_iteration(store: TensorStore, run: str, config: TrainConfig, iteration: int) -> SeedPlan:
    """The plan iteration `iteration` samples with. Iteration 0 has no explore phase before it,
    so it gets (and commits, for the train phase to read) the default plan."""
    if iteration == 0 and store.read_manifest(seed_plan_key(run, 0)) is None:
        publish_seed_plan(store, run, default_seed_plan(config, 0))
    plan = load_seed_plan(store, run, iteration)
    plan.check_matches(config)
    return plan
