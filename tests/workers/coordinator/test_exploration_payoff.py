"""A short cpu_smoke run with exploration: the ledger says which seeds came from exploration and what they paid,
and the report shows it beside captioned held-out grids."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np
import pytest

from resources.queue import open_queue
from workers.coordinator.context import RunContext, Sampling
from workers.coordinator.driver import FINAL_PHASES, ITERATION_PHASES
from workers.explore.state import ExploreConfig
from workers.trainer.grpo_trainer import default_seeds
from workers.trainer.presets import get_preset

EXPLORE = ExploreConfig(seed_multipliers=(2,), cache_levels=("half_steps",))  # tiny_policy has one block: no fbcache


def _wait_for_idle(queue, timeout_s: float = 60.0) -> None:
    """Let the worker finish exploring before training starts, so the plan is an explored one."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = queue.stats()
        if stats.pending == 0 and stats.leased == 0:
            return
        time.sleep(0.05)
    raise TimeoutError("the worker did not finish exploring")


@pytest.fixture
def explored_run(tmp_path, tiny_policy):
    """cpu_smoke (2 iterations, 2 prompts x 4 seeds) on queue workers that explore beside training."""
    import torch

    from tests.workers.coordinator.test_explore_pipeline import _worker_loop
    from workers.model.tiny_policy import save_policy

    torch.set_num_threads(1)
    save_policy(tiny_policy, tmp_path / "tiny")
    ctx = RunContext.local(
        tmp_path / "run", "x", "cpu_smoke", get_preset("cpu_smoke"), checkpoint=str(tmp_path / "tiny")
    )
    ctx = dataclasses.replace(
        ctx,
        sampling=Sampling(mode="workers", timeout_s=120),
        queue_url=str(tmp_path / "q.db"),
        explore_config=EXPLORE,
        report_every=1,
    )
    ctx.ledger.start_run("x", preset="cpu_smoke")
    results = {}
    with open_queue(ctx.queue_url) as queue:
        loop, _ = _worker_loop(queue, ctx.store)
        loop.config = dataclasses.replace(loop.config, max_idle_s=None)
        worker = threading.Thread(target=loop.run, daemon=True)
        worker.start()
        try:
            for k in range(ctx.num_iterations + 1):
                for name, phase in ITERATION_PHASES:
                    if ctx.is_final(k) and name not in FINAL_PHASES:
                        continue
                    if name == "policy_update":
                        _wait_for_idle(queue)
                    results[(k, name)] = phase(ctx, k)
        finally:
            loop.stop.set()
            worker.join(timeout=60)
    return ctx, results


@pytest.mark.slow
def test_a_run_with_exploration_shows_in_sql_and_in_the_report_whether_exploration_paid(explored_run) -> None:
    from PIL import Image

    ctx, results = explored_run
    payoff = ctx.ledger.query("SELECT * FROM exploration_payoff ORDER BY iteration").as_dicts()
    assert [r["iteration"] for r in payoff] == [0, 1]
    assert payoff[0]["planner"] == "default" and payoff[0]["explored_prompts"] == 0 and payoff[0]["random_prompts"] == 2
    assert payoff[1]["planner"] == "explore:m8-half_steps" and payoff[1]["explored_prompts"] == 2
    # The explored groups' variance is that of the real rewards the rollout of iteration 1 recorded.
    rewards = ctx.ledger.query(
        "SELECT prompt, reward FROM requests WHERE iteration = 1 AND kind = 'rollout' ORDER BY request_id"
    ).rows
    by_prompt: dict[str, list[float]] = {}
    for prompt, reward in rewards:
        by_prompt.setdefault(prompt, []).append(reward)
    assert payoff[1]["explored_variance"] == pytest.approx(np.mean([np.var(r) for r in by_prompt.values()]))
    explored, baseline = payoff[1]["explored_variance"], payoff[1]["baseline_variance"]
    assert payoff[1]["paid_off"] == (explored > baseline)
    assert payoff[1]["variance_ratio"] == (None if baseline == 0 else pytest.approx(explored / baseline))
    assert payoff[1]["random_stale_variance"] is not None and payoff[1]["arm"] == "m8-half_steps"
    groups = ctx.ledger.query(
        "SELECT prompt, source, seeds FROM seed_groups WHERE iteration = 1 ORDER BY prompt_index"
    ).rows
    sampled = ctx.ledger.query(
        "SELECT prompt, string_agg(seed::VARCHAR, ',' ORDER BY request_id) FROM requests "
        "WHERE iteration = 1 AND kind = 'rollout' GROUP BY prompt"
    ).rows
    assert {(p, seeds) for p, _, seeds in groups} == set(sampled) and {s for _, s, _ in groups} == {"explored"}
    defaults = ctx.ledger.query("SELECT seeds FROM seed_groups WHERE iteration = 0 ORDER BY prompt_index").rows
    assert [r[0] for r in defaults] == [",".join(map(str, g)) for g in default_seeds(ctx.train, 0)]

    page = (ctx.report_dir / "index.html").read_text()
    for name in ("payoff.png", "categories.png", "heldout_samples.png", "before_after.png"):
        assert f'src="{name}"' in page
        pixels = np.asarray(Image.open(ctx.report_dir / name).convert("L"))
        assert pixels.std() > 5, f"{name} is blank"
    assert "three red circles" in page and ("✓" in page or "✗" in page)  # captions: the prompt, pass/fail
    final = results[(2, "validation")].pictures
    assert {"heldout_samples", "before_after"} <= set(final)
    assert {"exploration_payoff", "heldout_by_category"} <= set(results[(2, "report")].pictures)
