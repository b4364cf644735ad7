"""Exploration beside training: idle workers explore, training's end cancels the rest, the plan uses what finished."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from resources.queue import open_queue
from workers.algo.selection import select_max_variance
from workers.explore.planning import review_iteration
from workers.explore.request import ExploreSpec, explore_rewards
from workers.explore.seed_plan import default_seed_plan, load_seed_plan, publish_seed_plan
from workers.explore.session import finish_exploration, start_exploration
from workers.explore.state import ExploreConfig
from workers.trainer.presets import get_preset

CONFIG = get_preset("cpu_smoke")  # 2 prompts x 4 seeds
EXPLORE = ExploreConfig(seed_multipliers=(2,), cache_levels=("half_steps",))  # tiny_policy has one block: no fbcache


@pytest.fixture
def queue(tmp_path):
    with open_queue(tmp_path / "queue.db") as q:
        yield q


def _worker_loop(queue, store, worker_id: str = "w1"):
    from workers.rollout.config import WorkerConfig
    from workers.rollout.loop import WorkerLoop
    from workers.rollout.worker import build_parser

    args = build_parser().parse_args(
        [
            "--queue",
            queue.url,
            "--store",
            store.url,
            "--worker-id",
            worker_id,
            "--max-idle-s",
            "0.5",
            "--poll-s",
            "0.05",
            "--lease-s",
            "30",
        ]
    )
    args.instance_type = "local-cpu"
    events = []
    loop = WorkerLoop(
        queue,
        store,
        WorkerConfig.from_args(args),
        threading.Event(),
        lambda event, **fields: events.append({"event": event, **fields}),
    )
    return loop, events


def test_idle_rollout_workers_explore_and_the_plan_is_made_from_their_rewards(
    queue, rollout_store, tiny_policy
) -> None:
    session = start_exploration(rollout_store, queue, "demo", CONFIG, 0, EXPLORE)
    assert session.arm == "m8-half_steps" and len(session.request_ids) == CONFIG.prompts_per_iteration
    loop, events = _worker_loop(queue, rollout_store)
    assert loop.run() == "idle"
    assert [e["request_id"] for e in events if e["event"] == "acked"] == session.request_ids
    finished = finish_exploration(rollout_store, queue, "demo", CONFIG, 0, EXPLORE, train_s=3.0)
    assert finished.num_done == 2 and finished.num_cancelled == 0 and finished.plan.planner == "explore:m8-half_steps"
    for i, prompt in enumerate(finished.plan.prompts):  # a worker's rewards equal a direct, fresh computation
        seeds, rewards = finished.results[i]
        assert rewards == explore_rewards(
            tiny_policy, ExploreSpec("demo", prompt, tuple(seeds), 0, CONFIG.sampler, "half_steps")
        )
        assert finished.plan.seeds[i] == select_max_variance(seeds, rewards, CONFIG.group_size)
    assert load_seed_plan(rollout_store, "demo", 1) == finished.plan


def test_training_that_ends_first_cancels_exploration_without_waiting_for_it(queue, rollout_store) -> None:
    session = start_exploration(rollout_store, queue, "demo", CONFIG, 0, EXPLORE)
    stuck = queue.claim("slow-worker", lease_s=120)  # a worker that will not finish before training does
    assert stuck is not None and stuck.request.kind == "explore"
    started = time.monotonic()
    finished = finish_exploration(rollout_store, queue, "demo", CONFIG, 0, EXPLORE, train_s=3.0)
    assert time.monotonic() - started < 5.0  # it did not wait out the 120 s lease
    assert finished.num_done == 0 and finished.num_cancelled == 2
    assert finished.plan.planner == "random:nothing-explored-in-time"
    assert finished.plan.seeds == default_seed_plan(CONFIG, 1).seeds
    assert set(queue.states(session.request_ids).values()) == {"cancelled"}
    assert queue.ack(stuck, "late-result") is False  # the late result is refused, the plan stays


def test_a_result_that_arrives_after_training_ended_never_changes_the_plan(queue, rollout_store) -> None:
    start_exploration(rollout_store, queue, "demo", CONFIG, 0, EXPLORE)
    late = queue.claim("w-late", lease_s=60)
    loop, _ = _worker_loop(queue, rollout_store)
    loop.run()  # the other request finishes in time
    first = finish_exploration(rollout_store, queue, "demo", CONFIG, 0, EXPLORE, train_s=3.0)
    from workers.explore.request import work_explore_request
    from workers.rollout.weights import PolicyHolder

    outcome = work_explore_request(late.request, rollout_store, PolicyHolder(rollout_store), worker_id="w-late")
    assert queue.ack(late, outcome.result_key) is False
    again = finish_exploration(rollout_store, queue, "demo", CONFIG, 0, EXPLORE, train_s=3.0)  # a redone phase
    assert first.num_done == again.num_done == 1 and again.plan == first.plan


def test_no_arm_within_the_budget_leaves_random_seeds_and_enqueues_nothing(queue, rollout_store) -> None:
    from workers.explore.planning import load_state, save_state

    state = load_state(rollout_store, "demo", EXPLORE, CONFIG.group_size)
    state.record_train_s(0, 0.01)  # training is far quicker than any exploration
    state.record_time(0, EXPLORE.arms(CONFIG.group_size)[0], 50.0, 2)
    save_state(rollout_store, "demo", state)
    session = start_exploration(rollout_store, queue, "demo", CONFIG, 1, EXPLORE)
    assert session.arm is None and "no arm fits" in session.reason and queue.stats().pending == 0
    finished = finish_exploration(rollout_store, queue, "demo", CONFIG, 1, EXPLORE)
    assert finished.plan.planner == "random:no-arm-fits-budget"


def test_the_monitor_reads_the_real_rewards_of_the_planned_seeds_from_the_rollout(rollout_store, tiny_policy) -> None:
    from workers.coordinator.rollout import iteration_requests, publish_batch
    from workers.trainer.grpo_trainer import GRPOTrainer

    plan = default_seed_plan(CONFIG, 0)
    publish_seed_plan(rollout_store, "demo", plan)
    requests = iteration_requests(CONFIG, "demo", 0, weights_version=0, plan=plan)
    batch = GRPOTrainer(tiny_policy, CONFIG).collect(0, seeds=plan.flat_seeds())
    publish_batch(rollout_store, "demo", 0, requests, batch, worker_id="trainer")
    review = review_iteration(rollout_store, "demo", CONFIG, 0, EXPLORE)
    assert review.kendall_tau is None and review.variance_gain is None  # a default plan has nothing to compare
    assert review.planned_variance == pytest.approx(float(batch.rewards.view(2, 4).var(dim=1, unbiased=False).mean()))


def test_the_report_plots_rank_consistency_and_gain_per_plan(mem_ledger, tmp_path) -> None:
    from resources.ledger.records import ExplorationRecord
    from workers.coordinator.report import write_report

    empty = write_report(mem_ledger, None, "demo", tmp_path / "empty").plots["exploration"]
    for k, tau in ((0, 0.4), (1, 0.1)):
        mem_ledger.record_exploration(
            ExplorationRecord(
                k,
                "m16-half_steps",
                budget_s=10.0,
                time_used_s=6.0,
                num_requests=8,
                kendall_tau=tau,
                spearman_rho=tau + 0.1,
                variance_gain=1.5,
            )
        )
    written = write_report(mem_ledger, None, "demo", tmp_path / "report")
    assert (tmp_path / "report" / "exploration.png").read_bytes()[:4] == b"\x89PNG"
    assert written.plots["exploration"] != empty and 'src="exploration.png"' in written.index.read_text()


@pytest.mark.slow
def test_a_run_on_queue_workers_explores_beside_training_and_records_it(tmp_path) -> None:
    import dagster as dg
    import torch

    from pipelines.run_walk import walk_iterations
    from tests.runs import run_resources
    from workers.model.tiny_policy import PolicyConfig, build_policy, save_policy

    torch.set_num_threads(1)
    two_blocks = PolicyConfig(image_size=16, num_layers=2, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
    save_policy(build_policy(two_blocks).eval(), tmp_path / "tiny")
    resources = run_resources(
        tmp_path / "run",
        "workers",
        run="x",
        preset="cpu_smoke",
        iterations=2,
        checkpoint=str(tmp_path / "tiny"),
        local_workers=1,
        rollout_timeout_s=300,
    )
    with open_queue(resources["queue"].url) as worker_queue:
        loop, _ = _worker_loop(worker_queue, resources["store"].get_store())
        loop.config = dataclasses.replace(loop.config, max_idle_s=None)
        worker = threading.Thread(target=loop.run, daemon=True)
        worker.start()
        try:
            outcomes = list(walk_iterations(dg.DagsterInstance.ephemeral(), resources))
        finally:
            loop.stop.set()
            worker.join(timeout=60)
    assert outcomes[0].metadata["exploration"]["enabled"] is True
    ledger = resources["ledger"].get_ledger()
    rows = ledger.query("SELECT iteration, arm, num_requests, budget_s, overhead_s FROM exploration ORDER BY 1").rows
    assert [r[0] for r in rows] == [0, 1] and all(r[1].startswith("m") for r in rows)
    explore_requests = ledger.query(
        "SELECT iteration, status FROM requests WHERE kind = 'explore' ORDER BY request_id"
    ).rows
    assert len(explore_requests) == 4  # 2 prompts per iteration
    store = resources["store"].get_store()
    for k, (_, _, done, _, _) in enumerate(rows):
        assert sum(s == "done" for i, s in explore_requests if i == k) == done
        planner = load_seed_plan(store, "x", k + 1).planner
        assert planner.startswith("explore:") == (done > 0 and not planner.startswith("random:fallback")), planner
    assert "explore" in {r[0] for r in ledger.query("SELECT phase FROM phases").rows}
    assert (tmp_path / "run" / "report" / "exploration.png").is_file()


def test_a_control_prompt_is_never_sent_to_the_pool_and_keeps_its_random_seeds_in_the_plan(
    queue, rollout_store
) -> None:
    control = ExploreConfig(seed_multipliers=(2,), cache_levels=("half_steps",), control_prompts=1)
    session = start_exploration(rollout_store, queue, "demo", CONFIG, 0, control)
    assert control.controls(1, 2) == [1] and session.prompt_indices == [0] and session.request_ids == ["explore-it0-p0"]
    claimed = queue.claim("w1", lease_s=60)
    assert claimed.request.request_id == "explore-it0-p0" and queue.claim("w2", lease_s=60) is None  # one request only
    from workers.explore.request import work_explore_request
    from workers.rollout.weights import PolicyHolder

    outcome = work_explore_request(claimed.request, rollout_store, PolicyHolder(rollout_store), worker_id="w1")
    assert queue.ack(claimed, outcome.result_key)
    finished = finish_exploration(rollout_store, queue, "demo", CONFIG, 0, control, train_s=3.0)
    assert finished.plan.planner == "explore:m8-half_steps" and finished.plan.control_prompts == (1,)
    assert finished.plan.seeds[1] == default_seed_plan(CONFIG, 1).seeds[1]
