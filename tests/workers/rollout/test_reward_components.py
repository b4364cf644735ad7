"""A multi-reward's components travel with the rollout results: a queue worker commits each component's value, the
train phase's stats report `reward/<name>`, and the ledger keeps them. A z-scored multi-reward, whose totals depend
on which images are scored together, is refused by queue workers before any compute and by the configuration of a
run that samples on queue workers."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from resources.keys import rollout_key
from resources.ledger import Ledger
from resources.queue import open_queue
from workers.algo.sampler import SamplerConfig
from workers.coordinator.rollout import (
    iteration_requests,
    load_batch,
    load_results,
    publish_batch,
    queue_batches,
    request_records,
)
from workers.explore.seed_plan import default_seed_plan
from workers.rollout.state import rollout_request
from workers.trainer.grpo_trainer import GRPOTrainer
from workers.trainer.presets import get_preset

MULTI = "multi:minigeneval=1.0,jpeg_compressibility=0.01"
ZSCORED = MULTI + ",normalize=zscore"
PARTS = ("jpeg_compressibility", "minigeneval")


def _config(reward: str, seeds_per_request: int = 2):
    """Two prompts of two samples, each prompt's group one batched request: the queue path at its smallest."""
    return dataclasses.replace(
        get_preset("cpu_smoke"),
        reward=reward,
        group_size=2,
        seeds_per_request=seeds_per_request,
        sampler=SamplerConfig(num_steps=3, sde_window=(0, 2), forward_dtype="fp32"),
    )


def _serve(queue_url: str, store) -> list[dict]:
    """One rollout worker (the worker process's claim loop) until the queue has stayed empty for a second; its
    events."""
    from workers.rollout.config import WorkerConfig
    from workers.rollout.loop import WorkerLoop
    from workers.rollout.worker import build_parser

    events: list[dict] = []
    args = build_parser().parse_args(
        [
            "--queue",
            queue_url,
            "--store",
            str(store.url),
            "--worker-id",
            "w0",
            "--max-idle-s",
            "1",
            "--poll-s",
            "0.05",
            "--threads",
            "1",
        ]
    )
    args.instance_type = "local-cpu"
    with open_queue(queue_url) as queue:
        WorkerLoop(
            queue,
            store,
            WorkerConfig.from_args(args),
            threading.Event(),
            lambda event, **f: events.append({"event": event, **f}),
        ).run()
    return events


def _enqueue(queue_url: str, config, iteration: int = 0):
    requests = iteration_requests(
        config, "demo", iteration, weights_version=0, plan=default_seed_plan(config, iteration)
    )
    with open_queue(queue_url) as queue:
        queue.put(
            [rollout_request(rid, iteration, spec) for rid, spec in queue_batches(requests, config.seeds_per_request)]
        )
    return requests


def test_a_queue_worker_commits_each_component_and_the_train_stats_and_the_ledger_show_them(
    rollout_store, tiny_policy, tmp_path
) -> None:
    config, queue_url = _config(MULTI), str(tmp_path / "queue.db")
    requests = _enqueue(queue_url, config)
    _serve(queue_url, rollout_store)

    results = load_results(rollout_store, "demo", 0, requests)
    parts = [m["reward_components"] for _, m in results]
    assert all(sorted(p) == list(PARTS) for p in parts)
    for (_, meta), p in zip(
        results, parts, strict=False
    ):  # the reward trained on is the weighted total of the committed parts
        assert meta["reward"] == pytest.approx(1.0 * p["minigeneval"] + 0.01 * p["jpeg_compressibility"])

    stats = GRPOTrainer(tiny_policy, config).batch_stats(load_batch(rollout_store, "demo", config, 0, requests))
    means = {name: float(np.mean([p[name] for p in parts])) for name in PARTS}
    assert {name: stats[f"reward/{name}"] for name in PARTS} == pytest.approx(means)

    ledger = Ledger.in_memory()
    ledger.record_requests(request_records(requests, results, 0))
    rows = ledger.query(
        "SELECT component, mean, num_requests FROM reward_components "
        "WHERE iteration = 0 AND kind = 'rollout' ORDER BY component"
    ).as_dicts()
    assert [r["component"] for r in rows] == list(PARTS) and {r["num_requests"] for r in rows} == {len(requests)}
    assert {r["component"]: r["mean"] for r in rows} == pytest.approx(means)


def test_a_single_reward_commits_no_components(rollout_store, tmp_path) -> None:
    config, queue_url = _config("minigeneval", seeds_per_request=1), str(tmp_path / "queue.db")
    requests = _enqueue(queue_url, config)
    _serve(queue_url, rollout_store)
    results = load_results(rollout_store, "demo", 0, requests)
    assert all("reward_components" not in m for _, m in results)
    assert load_batch(rollout_store, "demo", config, 0, requests).reward_components is None
    assert {r.reward_components for r in request_records(requests, results, 0)} == {None}


def test_in_process_rollouts_keep_the_components_the_trainer_scored(tmp_store, tiny_policy) -> None:
    config = _config(MULTI)
    plan = default_seed_plan(config, 1)
    requests = iteration_requests(config, "demo", 1, weights_version=1, plan=plan)
    collected = GRPOTrainer(tiny_policy, config).collect(1, seeds=plan.flat_seeds(), keep_all=True)
    publish_batch(tmp_store, "demo", 1, requests, collected, "trainer")
    loaded = load_batch(tmp_store, "demo", config, 1, requests)
    assert sorted(loaded.reward_components) == list(PARTS)
    for name in PARTS:
        np.testing.assert_allclose(loaded.reward_components[name], collected.reward_components[name])


def test_a_queue_worker_refuses_a_zscored_multi_reward_before_sampling(rollout_store, tmp_path) -> None:
    config, queue_url = _config(ZSCORED), str(tmp_path / "queue.db")
    requests = _enqueue(queue_url, config)
    events = _serve(queue_url, rollout_store)
    failed = [e for e in events if e["event"] == "failed"]
    assert failed and all("normalize=zscore" in e["error"] and "--rollouts inprocess" in e["error"] for e in failed)
    assert not [e for e in events if e["event"] in ("claim", "step", "done")]  # refused before any compute
    assert all(rollout_store.read_manifest(rollout_key("demo", 0, r.request_id)) is None for r in requests)


def test_a_run_on_queue_workers_refuses_a_zscored_reward_before_any_compute(tmp_path) -> None:
    from pipelines.deploy import DeploymentError
    from tests.runs import run_resources

    for mode in ("workers", "local_cluster"):
        with pytest.raises(DeploymentError, match="normalize=zscore.*normalize=none with queue workers"):
            run_resources(tmp_path / mode, mode, preset="cpu_smoke", reward=ZSCORED)
    # In-process rollouts are scored by the trainer over the whole iteration: z-scoring means what it says there.
    run_resources(tmp_path / "inprocess", "inprocess", preset="cpu_smoke", reward=ZSCORED)
