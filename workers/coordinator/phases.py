"""The phases of one iteration k as plain functions: sync, rollout, train, validate, report
(explore: explore_phases.py).

Iteration k: `sync_phase` publishes weights version k (PULSE patch k-1 -> k), `rollout_phase`
samples the iteration's requests at version k with the seeds planned by iteration k-1,
`train_phase` turns version k into k+1, `validate_phase` scores version k on the held-out
split, `report_phase` closes the iteration. Iteration N (the run's length) is the final
one: only sync, validate and report run there, on the trained weights.

Each phase reads its inputs from the store under explicit keys, writes the ledger (the
coordinator is its only writer) and returns a `PhaseResult`: the numbers, pictures and
checks a person looks at (the Dagster assets show them), plus the plain record `spotlight
train` prints. Every write is keyed, so running a phase again replaces its rows.

Example:
    for k in range(ctx.num_iterations + 1):
        results = run_iteration(ctx, k)       # workers/coordinator/driver.py
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from resources.keys import iteration_label, rollouts_prefix, run_rewards_key
from resources.ledger.records import SyncRecord, TrainStepRecord
from workers.coordinator import books
from workers.coordinator.context import RunContext
from workers.coordinator.hacking_guard import HACKING_CHECK, guard_validation, guarded_train_config, held_out_signals
from workers.coordinator.plots import histogram_png, image_grid_png, line_plot_png
from workers.coordinator.report import write_report
from workers.coordinator.rollout import iteration_requests, load_results, request_records
from workers.coordinator.rollout_dispatch import sample_requests
from workers.coordinator.sample_grids import heldout_pictures
from workers.coordinator.sync import publish_version
from workers.coordinator.text_encoders import encode_run_prompts
from workers.coordinator.train import train_iteration
from workers.explore.seed_plan import load_seed_plan, plan_for_iteration
from workers.model.families.prompt_store import publish_run_prompt_embeddings
from workers.model.tiny_policy import shipped_base_for
from workers.task.prompt_file import train_prompts
from workers.task.validation import resolve_validation
from workers.trainer.ema_weights import evaluated_policy
from workers.trainer.resident import release_memory, resident_checkpoint, resident_policy

PATCH_CHECK = "patch_reproduces_trainer_hash"
REWARDS_CHECK = "rewards_finite"
GUARD_CHECK = "validation_not_below_guard"


@dataclass
class PhaseResult:
    """What a phase shows: plain numbers, tables, file paths, PNG pictures and named checks."""

    metadata: dict[str, Any] = field(default_factory=dict)
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """name -> rows (column -> str, int, float or bool; every row the same columns)."""
    paths: dict[str, str] = field(default_factory=dict)
    pictures: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    """name -> (PNG bytes, caption)."""
    checks: dict[str, tuple[bool, dict]] = field(default_factory=dict)
    """check name -> (passed, its metadata)."""
    record: dict[str, Any] = field(default_factory=dict)
    """The phase's part of `spotlight train`'s per-iteration record."""


def sync_phase(ctx: RunContext, k: int) -> PhaseResult:
    """Weights version k in the run's PULSE chain (the base's anchor for k = 0), checked by a receiver that applies
    it to version k-1 as workers hold it (workers/coordinator/sync.py)."""
    books.begin_iteration(ctx.ledger, ctx, k)
    with books.phase(ctx.ledger, k, "sync"):
        publish_run_rewards(ctx)
        base = ctx.checkpoint or shipped_base_for(ctx.train.prompts and ctx.train.prompts.path)
        out = publish_version(ctx.store, ctx.run, k, anchor_every=ctx.anchor_every, base=base, model=ctx.model)
        cached = None
        if ctx.model is not None and k == 0:
            # The base just became the resident policy: encode the whole run's prompts once, drop the encoders.

            cached = encode_run_prompts(ctx, resident_policy())
            release_memory()
        if ctx.model is not None and ctx.sampling.mode != "inprocess":
            # Workers read iteration k's and k+1's (explore) prompt embeddings; the pixel policy has none to cache.

            c = ctx.train
            publish_run_prompt_embeddings(
                ctx.store, ctx.run, [p for i in range(k, min(k + 2, ctx.num_iterations)) for p in train_prompts(c, i)]
            )
    ctx.ledger.record_sync(
        SyncRecord(
            version=k,
            kind=out.kind,
            dense_bytes=out.dense_bytes,
            patch_bytes=out.sent_bytes,
            iteration=k,
            changed_fraction=out.changed_fraction,
            encode_s=out.encode_s,
            apply_s=out.apply_s,
            weights_hash=out.trainer_hash,
        )
    )
    meta = {
        "weights_version": k,
        "kind": out.kind,
        "dense_bytes": out.dense_bytes,
        "sent_bytes": out.sent_bytes,
        "times_smaller": round(out.dense_bytes / max(out.sent_bytes, 1), 2),
        "changed_fraction": out.changed_fraction,
        "encode_s": out.encode_s,
        "apply_s": out.apply_s,
        "receiver": out.receiver,
        "replay_s": out.replay_s,
        "weights_hash": out.trainer_hash,
        "anchor_stored": out.anchored,
        **phase_cost(ctx, k, "sync"),
        **({} if cached is None else {"prompts_cached_then_text_encoders_dropped": cached}),
    }
    check = (out.reproduced, {"trainer_hash": out.trainer_hash, "receiver_hash": out.receiver_hash})
    return PhaseResult(meta, checks={PATCH_CHECK: check})


def publish_run_rewards(ctx: RunContext) -> None:
    """The rewards this run scores with, where every worker reads them (resources.keys.run_rewards_key): a worker
    refuses a request whose reward is not among them."""
    import json

    validation = resolve_validation(ctx.validation, ctx.train.reward, model=ctx.model is not None).reward
    ctx.store.put_bytes(run_rewards_key(ctx.run), json.dumps(sorted({ctx.train.reward, validation})).encode())


def rollout_phase(ctx: RunContext, k: int) -> PhaseResult:
    """The iteration's samples per prompt at weights version k, scored by the reward, on whoever samples."""
    plan = plan_for_iteration(ctx.store, ctx.run, ctx.train, k)
    requests = iteration_requests(ctx.train, ctx.run, k, weights_version=k, plan=plan)
    with books.phase(ctx.ledger, k, "rollout"):
        summary = sample_requests(ctx, k, requests)
    results = load_results(ctx.store, ctx.run, k, requests)
    ctx.ledger.record_requests(request_records(requests, results, k, enqueued_at=summary.enqueued_at))
    finite = [r for r in (float(m["reward"]) for _, m in results) if math.isfinite(r)]
    meta = {
        "mode": summary.mode,
        "num_requests": len(requests),
        "planner": plan.planner,
        "reward_mean": sum(finite) / max(len(finite), 1),
        "reward_min": min(finite, default=float("nan")),
        "reward_max": max(finite, default=float("nan")),
        "retried_requests": sum(int(m.get("attempt", 1)) > 1 for _, m in results),
        "preemptions": summary.preemptions,
        "workers_started": summary.workers_started,
        **phase_cost(ctx, k, "rollout"),
    }
    out = PhaseResult(
        meta, checks={REWARDS_CHECK: (len(finite) == len(requests), {"finite": len(finite), "requests": len(requests)})}
    )
    if ctx.draws(k):
        import numpy as np

        grid = image_grid_png(
            np.stack([t["image"].numpy() for t, _ in results]), columns=max(len(g) for g in plan.seeds)
        )
        write_grid(ctx, f"{iteration_label(k)}-rollouts.png", grid)
        out.pictures = {
            "reward_histogram": (histogram_png(finite, f"rewards, iteration {k}", "reward"), "rewards"),
            "samples": (grid, "one row per prompt, one column per seed"),
        }
    return out


def train_phase(ctx: RunContext, k: int) -> PhaseResult:
    """GRPO on the iteration's rollouts: weights version k -> k+1 (checkpoint in the store)."""
    requests = iteration_requests(ctx.train, ctx.run, k, weights_version=k, plan=load_seed_plan(ctx.store, ctx.run, k))
    config = guarded_train_config(ctx, k)  # a reward-hacking rollback lowers the lr / raises the KL from then on
    with books.phase(ctx.ledger, k, "train") as window:
        stats = train_iteration(ctx.store, ctx.run, config, k, requests, ctx.device)
    ctx.ledger.record_train_step(
        TrainStepRecord(
            iteration=k,
            step=0,
            loss=stats.get("loss"),
            kl=stats.get("kl"),
            reward_mean=stats["reward_mean"],
            reward_std=stats["reward_std"],
            zero_std_ratio=stats["zero_std_ratio"],
            clip_fraction=stats.get("clip_frac"),
            grad_norm=stats.get("grad_norm"),
            learning_rate=stats.get("learning_rate", config.grpo.lr),
            duration_s=window.seconds,
        )
    )
    meta = {
        "weights_version_out": k + 1,
        **{name: float(v) for name, v in stats.items()},
        **phase_cost(ctx, k, "train"),
    }
    return PhaseResult(meta, record={name: v for name, v in stats.items() if name != "checkpoint_bytes"})


def validate_phase(ctx: RunContext, k: int) -> PhaseResult:
    """Held-out prompts, fixed seeds, ODE sampling: the score of weights version k (on schedule), by MiniGenEval's
    detector (the pixel policy's default) or by a reward (a --model run's reward, or --validation-reward)."""
    plan = resolve_validation(ctx.validation, ctx.train.reward, model=ctx.model is not None)
    named = None if plan.detector else plan.reward  # the detector's records keep their fields
    if not ctx.validates(k):
        return PhaseResult(
            {"validated": False, "validate_every": ctx.train.validate_every},
            checks={GUARD_CHECK: (True, {"validated": False}), HACKING_CHECK: (True, {"validated": False})},
            record=validation_record(None, named),
        )

    policy, _ = resident_checkpoint(ctx.store, ctx.run, k, ctx.device)
    seeds = ctx.train.validation_seeds
    with books.phase(ctx.ledger, k, "validate"), evaluated_policy(policy, ctx.train, ctx.store, ctx.run, k) as view:
        scored, sampler = view  # with train.ema the EMA weights, at eval_guidance, with validation_steps
        result = plan.evaluate(
            scored,
            seeds,
            sampler,
            keep_images=True,  # the guard reads the images
            batch_size=ctx.train.rollout_batch,
        )
        signals = held_out_signals(ctx, k, result, plan.reward, seeds)
    del policy
    release_memory()
    with ctx.ledger.held():  # the sampling is done: what is left is ledger work, the guard's and the pictures
        return _validation_result(ctx, k, plan, result, signals, seeds, named)


def _validation_result(ctx: RunContext, k: int, plan, result, signals, seeds: int, named) -> PhaseResult:
    """Record version k's held-out result, judge it (the drop guard, the hacking guard) and draw it."""
    criteria = {**result.per_criterion, **{f"category.{c}": v for c, v in result.per_category.items()}}
    ctx.ledger.record_validation(
        k,
        weights_version=k,
        score=result.score,
        num_prompts=len(set(result.prompts)),
        criteria=criteria,
        reward=plan.reward,
    )
    base = books.base_validation_score(ctx.ledger)
    guard = None if base is None else base - ctx.max_validation_drop
    meta = {
        "weights_version": k,
        "reward": plan.reward,
        "score": result.score,
        "partial": result.partial,
        "base_score": base,
        "guard": guard,
        **{f"category/{c}": v for c, v in result.per_category.items()},
        **({} if plan.detector else result.per_criterion),
        **phase_cost(ctx, k, "validate"),
    }
    out = PhaseResult(
        meta,
        checks={GUARD_CHECK: (guard is None or result.score >= guard, {"score": result.score, "guard": guard})},
        record=validation_record(result, named),
    )
    hacking_guard_result(ctx, k, signals, out)
    if ctx.draws(k):
        out.pictures = validation_pictures(ctx, k, result, seeds, named)
    return out


def hacking_guard_result(ctx: RunContext, k: int, signals, out: PhaseResult) -> None:
    """Judge version k's reward-hacking signals (workers/coordinator/hacking_guard.py), act on a flag, and add
    the verdict to the phase's metadata, checks and record (`hacking_action` stop: the driver ends the run)."""
    verdict, action = guard_validation(ctx, k, signals)
    fields = {
        "hacking_flagged": verdict.flagged,
        "hacking_rule": verdict.rule,
        "hacking_action": action,
        "proxy_heldout": round(signals.proxy, 6),
        "gold_heldout": round(signals.gold, 6),
    }
    out.metadata.update({**fields, "hacking_detail": verdict.detail})
    out.record.update(fields)
    out.checks[HACKING_CHECK] = (
        not verdict.flagged,
        {
            "rule": verdict.rule,
            "detail": verdict.detail,
            "action": action,
            "proxy": signals.proxy,
            "gold": signals.gold,
        },
    )


def validation_pictures(ctx: RunContext, k: int, result, seeds: int, reward: str | None) -> dict:
    """The held-out score so far, a grid of the first fixed seed's images, and the captioned held-out grids (the
    detector's pass/fail per criterion, or the reward's value of each image when `reward` scored them)."""
    first_seed = result.images[::seeds] if reward is None else result.images[::seeds][:16]  # big images: 16 at most
    grid = image_grid_png(first_seed, columns=8)
    write_grid(ctx, f"{iteration_label(k)}-validation.png", grid)
    curve = ctx.ledger.query("SELECT weights_version, score FROM validation ORDER BY weights_version").rows
    plot = line_plot_png(
        {"held-out": ([r[0] for r in curve], [r[1] for r in curve])},
        "validation",
        "weights version",
        "strict score" if reward is None else reward[:40],
    )
    pictures = {"curve": (plot, "held-out score so far"), "samples": (grid, "held-out prompts, first fixed seed")}
    pictures.update(
        heldout_pictures(
            ctx.report_dir,
            k,
            result.images[::seeds],
            result.prompts[::seeds],
            scores=result.scores[::seeds],
            reward=reward,
        )
    )
    return pictures


def report_phase(ctx: RunContext, k: int) -> PhaseResult:
    """Close the iteration in the ledger (the final one also closes the run), rewrite the report folder, and drop
    rollout results older than the context keeps."""
    with ctx.ledger.held():  # ledger work and plots only: one connection for all of it
        return _report_phase(ctx, k)


def _report_phase(ctx: RunContext, k: int) -> PhaseResult:
    books.end_iteration(ctx.ledger, ctx, k)
    if ctx.keep_rollout_iterations is not None and k - ctx.keep_rollout_iterations >= 0:
        old = rollouts_prefix(ctx.run, k - ctx.keep_rollout_iterations)
        for key in ctx.store.list_commits(old):
            ctx.store.delete_commit(key)
    cost = ctx.ledger.query(
        "SELECT usd_total, usd_spot, usd_reserved, critical_path_s FROM cost_per_iteration WHERE iteration = ?", [k]
    ).as_dicts()
    meta = {
        "final": ctx.is_final(k),
        **{f"iteration_{name}": float(v or 0.0) for name, v in (cost[0] if cost else {}).items()},
    }
    out = PhaseResult(meta)
    if ctx.draws(k):
        written = write_report(ctx.ledger, ctx.store, ctx.run, ctx.report_dir)
        out.paths = {"report": str(written.index)}
        out.pictures = {
            "rewards": (written.plots["reward"], "reward per iteration"),
            "cost": (written.plots["cost"], "cost per iteration"),
            "heldout_by_category": (written.plots["categories"], "held-out score per category"),
            "exploration_payoff": (written.plots["payoff"], "explored vs random seeds' reward variance"),
        }
    return out


def validation_record(result, reward: str | None = None) -> dict:
    """`spotlight train`'s validation fields of one iteration (all None when it was not validated); with `reward`
    (a reward, not MiniGenEval's detector, scored it) also `validation_reward`."""
    named = {} if reward is None else {"validation_reward": reward}
    if result is None:
        return {
            "validation_score": None,
            "validation_partial": None,
            "validation_per_category": None,
            "validation_per_criterion": None,
            "validation_num_prompts": None,
            **named,
        }
    return {
        "validation_score": round(result.score, 6),
        "validation_partial": None if result.partial is None else round(result.partial, 6),
        "validation_per_category": {c: round(v, 6) for c, v in result.per_category.items()},
        "validation_per_criterion": {c: round(v, 6) for c, v in result.per_criterion.items()},
        "validation_num_prompts": len(set(result.prompts)),
        **named,
    }


def phase_cost(ctx: RunContext, k: int, phase: str) -> dict[str, float]:
    """The phase's wall time and USD (spot / reserved) as metadata fields."""
    c = books.phase_cost(ctx.ledger, k, phase)
    return {
        "phase_wall_s": round(c["wall_s"], 3),
        "phase_usd": c["usd"],
        "phase_usd_spot": c["usd_spot"],
        "phase_usd_reserved": c["usd_reserved"],
    }


def write_grid(ctx: RunContext, name: str, png: bytes) -> None:
    """Sample grids go to the report folder's grids/ (the report page links them)."""
    out = ctx.report_dir / "grids"
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_bytes(png)
