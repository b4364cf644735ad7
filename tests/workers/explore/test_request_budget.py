"""A pool's exploration on a budget counted in samples: the plan is a function of the run seed, not of the load."""

from __future__ import annotations

import threading
import time

import pytest

from resources.queue import open_queue
from workers.explore.seed_plan import default_seed_plan
from workers.explore.session import finish_exploration, start_exploration
from workers.explore.state import ExploreConfig
from workers.trainer.presets import get_preset

CONFIG = get_preset("cpu_smoke")  # 2 prompts x G = 4
ARMS = {"seed_multipliers": (2,), "cache_levels": ("half_steps",)}  # m8-half_steps: 4 samples' work per prompt


def _serve(queue_path, store, worker_id: str, delay_s: float = 0.0) -> None:
    """A rollout worker that starts `delay_s` late (a loaded machine) and serves the queue until it is idle."""
    from workers.rollout.config import WorkerConfig
    from workers.rollout.loop import WorkerLoop
    from workers.rollout.worker import build_parser

    time.sleep(delay_s)
    with open_queue(queue_path) as queue:
        args = build_parser().parse_args(
            ["--queue", queue.url, "--store", store.url, "--worker-id", worker_id]
            + ["--max-idle-s", "0.5", "--poll-s", "0.05", "--lease-s", "30"]
        )
        args.instance_type = "local-cpu"
        WorkerLoop(queue, store, WorkerConfig.from_args(args), threading.Event(), lambda event, **f: None).run()


def _explore_one_iteration(store, tmp_path, run: str, explore: ExploreConfig, worker_delay_s: float | None):
    """Start iteration 0's exploration, let a worker serve it (now, or `worker_delay_s` into training), end
    training at once and return the plan of iteration 1. None: the worker has finished before training ends."""
    from workers.model.tiny_policy import SHIPPED_BASE, load_policy
    from workers.rollout.weights import publish_policy

    publish_policy(store, run, load_policy(SHIPPED_BASE))  # the shipped base: its rewards differ between seeds
    path = tmp_path / f"{run}.db"
    with open_queue(path) as queue:
        session = start_exploration(store, queue, run, CONFIG, 0, explore)
        if worker_delay_s is None:
            _serve(path, store, f"{run}-w")
            late = None
        else:
            late = threading.Thread(target=_serve, args=(path, store, f"{run}-w", worker_delay_s))
            late.start()
        finished = finish_exploration(store, queue, run, CONFIG, 0, explore, train_s=0.1)
    if late is not None:
        late.join()
    return session, finished


def test_a_run_seed_plans_the_same_seeds_whatever_the_load_on_a_budget_counted_in_samples(tmp_store, tmp_path) -> None:
    budget = ExploreConfig(**ARMS, budget_samples=8.0, budget_wait_s=60.0)
    _, idle = _explore_one_iteration(tmp_store, tmp_path, "idle", budget, worker_delay_s=None)
    session, loaded = _explore_one_iteration(tmp_store, tmp_path, "loaded", budget, worker_delay_s=1.0)
    assert session.budget_s == 8.0 and "budget counted in samples" in session.reason
    assert idle.plan.planner == loaded.plan.planner == "explore:m8-half_steps"
    assert loaded.num_done == idle.num_done == CONFIG.prompts_per_iteration and loaded.num_cancelled == 0
    assert loaded.plan.seeds == idle.plan.seeds and loaded.plan.explored_rewards == idle.plan.explored_rewards
    assert idle.plan.seeds != default_seed_plan(CONFIG, 1).seeds  # exploration changed which seeds are trained
    assert loaded.time_used_s == idle.time_used_s == 8.0  # samples, not seconds


def test_on_the_wall_clock_the_same_two_runs_plan_different_seeds(tmp_store, tmp_path) -> None:
    """The stop the budget replaces: training that ends before the loaded worker starts leaves random seeds."""
    clock = ExploreConfig(**ARMS)
    _, idle = _explore_one_iteration(tmp_store, tmp_path, "idle", clock, worker_delay_s=None)
    _, loaded = _explore_one_iteration(tmp_store, tmp_path, "loaded", clock, worker_delay_s=1.0)
    assert idle.plan.planner == "explore:m8-half_steps"
    assert loaded.plan.planner == "random:nothing-explored-in-time" and loaded.plan.seeds != idle.plan.seeds
    assert loaded.plan.seeds == default_seed_plan(CONFIG, 1).seeds


def test_a_budget_below_every_arm_enqueues_nothing_and_keeps_random_seeds(tmp_store, tmp_path) -> None:
    short = ExploreConfig(**ARMS, budget_samples=4.0, budget_wait_s=60.0)  # one prompt's work of the two
    session, finished = _explore_one_iteration(tmp_store, tmp_path, "short", short, worker_delay_s=None)
    assert session.arm is None and session.request_ids == [] and "no arm fits" in session.reason
    assert finished.plan.planner == "random:no-arm-fits-budget"
    assert finished.plan.seeds == default_seed_plan(CONFIG, 1).seeds


@pytest.mark.parametrize("change", [{"budget_samples": 0.0}, {"budget_wait_s": 0.0}])
def test_a_budget_that_is_not_positive_is_refused_with_the_field_named(change: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(change))):
        ExploreConfig(**change)


class _SlowQueue:
    """The queue as the seed plan's wait sees it: planned request i has a result `every_s` x (i + 1) after start."""

    def __init__(self, ids: list[str], every_s: float) -> None:
        self.ids, self.every_s, self.start = ids, every_s, time.monotonic()

    def results(self, ids: list[str]) -> dict[str, str]:
        done = int((time.monotonic() - self.start) / self.every_s)
        return {rid: "key" for rid in self.ids[:done] if rid in ids}


def test_the_wait_follows_workers_that_make_progress_however_long_they_take_in_all() -> None:
    from workers.explore.session import Session, _wait_for_planned

    session = Session(0, "m8-half_steps", 8.0, None, None, "", request_ids=["a", "b", "c"], prompt_indices=[0, 1, 2])
    started = time.monotonic()
    assert _wait_for_planned(_SlowQueue(session.request_ids, every_s=0.4), session, stall_s=0.7) == 0
    assert time.monotonic() - started > 0.7 * 1.5  # longer in all than the stall limit: progress kept it waiting
    assert _wait_for_planned(_SlowQueue(session.request_ids, every_s=60.0), session, stall_s=0.3) == 3


def test_with_no_worker_serving_the_plan_stops_waiting_after_the_stall_and_counts_what_is_missing(
    tmp_store, tmp_path
) -> None:
    from workers.model.tiny_policy import SHIPPED_BASE, load_policy
    from workers.rollout.weights import publish_policy

    explore = ExploreConfig(**ARMS, budget_samples=8.0, budget_wait_s=0.3)
    publish_policy(tmp_store, "nobody", load_policy(SHIPPED_BASE))
    with open_queue(tmp_path / "nobody.db") as queue:
        start_exploration(tmp_store, queue, "nobody", CONFIG, 0, explore)
        finished = finish_exploration(tmp_store, queue, "nobody", CONFIG, 0, explore, train_s=0.1)
    assert finished.num_missing == CONFIG.prompts_per_iteration and finished.num_done == 0
    assert finished.plan.planner == "random:nothing-explored-in-time"
