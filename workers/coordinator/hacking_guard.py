"""The reward-hacking guard of the validate phase: signals of each validation into the ledger, the rule's verdict,
and what the run does when it fires (warn, stop, or roll back to the best-gold weights).

Per validation of weights version k: the training (proxy) reward of the held-out images, the gold (validation)
reward's per-image scores, both with standard errors, a multi proxy's components, and cheap image statistics
(workers/task/image_stats.py). The rule (workers/algo/hacking.py) judges the validations since the base or the
last rollback. The best unflagged gold's weights are kept under `guard_best_key(run)` (trainer checkpoints older
than the last two are deleted). A rollback at iteration k publishes them as checkpoint k+1, the one the next
iteration syncs and trains from (on the final iteration: as checkpoint k, the run's result), and every later
update runs at `rollback_lr_scale`^n of the learning rate and `rollback_kl_beta` (n rollbacks so far).

Example:
    verdict = guard_validation(ctx, k, result, plan, seeds)   # inside validate_phase
    config = guarded_train_config(ctx, k)                     # inside train_phase
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field

import numpy as np

from resources.keys import run_prefix, weights_key
from resources.ledger.records import HACKING_ACTIONS, HackingRollbackRecord, HackingSignalsRecord
from resources.settings.config import GuardSection
from workers.algo.hacking import HackingRule, Signals, Verdict, judge, standard_error
from workers.coordinator.context import RunContext
from workers.task.image_stats import image_statistics
from workers.task.rewards import get_reward, score_with_components

_GUARD = GuardSection()
"""The guard's defaults are the run config tree's."""

HACKING_CHECK = "no_reward_hacking"
STAT_COLUMNS = ("edge_density", "colour_entropy", "saturation", "compressed_bytes", "diversity")


@dataclass(frozen=True)
class HackingGuardConfig:
    """What the guard watches and what the run does when it fires (`--on-hacking` and its companions)."""

    on_hacking: str = _GUARD.on_hacking
    """warn (record, fail the Dagster check), stop (end the run after this iteration, resumable) or rollback."""
    rule: HackingRule = field(default_factory=HackingRule)
    rollback_lr_scale: float = _GUARD.rollback_lr_scale
    """After each rollback the learning rate is multiplied by this (1 keeps it)."""
    rollback_kl_beta: float | None = None
    """After a rollback, train with at least this KL coefficient to the base (None keeps the preset's)."""

    def __post_init__(self) -> None:
        if self.on_hacking not in HACKING_ACTIONS:
            raise ValueError(f"on_hacking must be one of {HACKING_ACTIONS}, got {self.on_hacking!r}")
        if not (math.isfinite(self.rollback_lr_scale) and 0 < self.rollback_lr_scale <= 1):
            raise ValueError(f"rollback_lr_scale must lie in (0, 1], got {self.rollback_lr_scale!r}")
        if self.rollback_kl_beta is not None and not (
            math.isfinite(self.rollback_kl_beta) and self.rollback_kl_beta >= 0
        ):
            raise ValueError(f"rollback_kl_beta must be a number >= 0 or None, got {self.rollback_kl_beta!r}")


def guard_best_key(run: str) -> str:
    """Trainer checkpoint of the best unflagged gold score so far (commit key)."""
    return f"{run_prefix(run)}guard/best"


def guard_config(ctx: RunContext) -> HackingGuardConfig:
    return ctx.hacking if ctx.hacking is not None else HackingGuardConfig()


def held_out_signals(ctx: RunContext, k: int, result, gold_reward: str, seeds: int) -> HackingSignalsRecord:
    """The unjudged signals of weights version k's held-out images (`result` kept its images)."""
    proxy, parts = score_with_components(get_reward(ctx.train.reward), result.images, list(result.prompts))
    stats = image_statistics(result.images, seeds)
    components = {name: float(np.mean(v)) for name, v in parts.items()}
    return HackingSignalsRecord(
        iteration=k,
        weights_version=k,
        proxy_reward=ctx.train.reward,
        proxy=float(np.mean(proxy)),
        proxy_se=standard_error([float(p) for p in proxy]),
        gold_reward=gold_reward,
        gold=float(result.score),
        gold_se=standard_error(list(result.scores)),
        proxy_components=json.dumps(components) if components else None,
        **{name: None if not math.isfinite(stats[name]) else stats[name] for name in STAT_COLUMNS},
    )


def _signals(row: dict) -> Signals:
    return Signals(
        int(row["iteration"]),
        row["proxy"],
        row["proxy_se"],
        row["gold"],
        row["gold_se"],
        {n: row[n] for n in STAT_COLUMNS if row.get(n) is not None},
    )


def _history(ledger, k: int) -> tuple[list[Signals], Signals | None]:
    """(the validations before k since the base or the last rollback, the restored weights' first; the base's)."""
    rows = ledger.query("SELECT * FROM hacking_signals WHERE iteration < ? ORDER BY iteration", [k]).as_dicts()
    base = next((_signals(r) for r in rows if r["weights_version"] == 0), None)
    back = ledger.query(
        "SELECT iteration, restored_version FROM hacking_rollbacks WHERE iteration < ? ORDER BY iteration DESC LIMIT 1",
        [k],
    ).rows
    if not back:
        return [_signals(r) for r in rows], base
    at, restored = back[0]
    first = [_signals(r) for r in rows if r["weights_version"] == restored][:1]
    return first + [_signals(r) for r in rows if r["iteration"] > at], base


def guard_validation(ctx: RunContext, k: int, record: HackingSignalsRecord) -> tuple[Verdict, str | None]:
    """Judge version k's signals, record them with the verdict, keep the best-gold weights, and act on a flag:
    returns (the verdict, the action taken: None, warn, stop or rollback)."""
    config = guard_config(ctx)
    history, base = _history(ctx.ledger, k)
    now = _signals(dataclasses.asdict(record))
    verdict = judge(history + [now], base or now, config.rule)
    action = config.on_hacking if verdict.flagged else None
    if action == "rollback" and not _best_exists(ctx):
        action = "stop"  # nothing better to go back to (cannot happen after a validated base): stop instead
    ctx.ledger.record_hacking_signals(
        dataclasses.replace(
            record, flagged=verdict.flagged, rule=verdict.rule, detail=verdict.detail or None, action=action
        )
    )
    if not verdict.flagged:
        _keep_if_best(ctx, k, record.gold)
    elif action == "rollback":
        _roll_back(ctx, k, config)
    return verdict, action


def _best_gold(ledger, before: int | None = None) -> tuple[int, float] | None:
    """(weights version, gold) of the best unflagged validation (the earliest of equals), optionally before k."""
    sql = "SELECT weights_version, gold FROM hacking_signals WHERE NOT flagged"
    params = []
    if before is not None:
        sql, params = sql + " AND iteration < ?", [before]
    rows = ledger.query(sql + " ORDER BY gold DESC, iteration LIMIT 1", params).rows
    return (int(rows[0][0]), float(rows[0][1])) if rows else None


def _best_exists(ctx: RunContext) -> bool:
    return ctx.store.read_manifest(guard_best_key(ctx.run)) is not None


def _copy_checkpoint(store, source: str, target: str, version: int) -> None:
    """Publish the checkpoint at `source` again under `target`, as weights version `version`."""
    manifest = store.read_manifest(source)
    if manifest is None:
        raise LookupError(f"no checkpoint at {store.url}/{source} to copy")
    store.publish_tensors(target, store.load_tensors(source), {**manifest.metadata, "version": version})


def _keep_if_best(ctx: RunContext, k: int, gold: float) -> None:
    """Keep version k's checkpoint as the best when its gold beats every earlier unflagged one (ties: the earlier)."""
    best = _best_gold(ctx.ledger, before=k)
    if best is None or gold > best[1] or not _best_exists(ctx):
        _copy_checkpoint(ctx.store, weights_key(ctx.run, k), guard_best_key(ctx.run), k)


def _roll_back(ctx: RunContext, k: int, config: HackingGuardConfig) -> None:
    """Publish the best-gold weights as the next checkpoint (the final one on the last iteration) and record it."""
    best = _best_gold(ctx.ledger)
    assert best is not None, "a rollback needs an unflagged validation (the base's at least)"
    into = k if ctx.is_final(k) else k + 1
    _copy_checkpoint(ctx.store, guard_best_key(ctx.run), weights_key(ctx.run, into), into)
    grpo = rolled_back_grpo(ctx.train.grpo, config, rollbacks_before(ctx.ledger, k) + 1)
    ctx.ledger.record_hacking_rollback(
        HackingRollbackRecord(
            iteration=k,
            restored_version=best[0],
            restored_gold=best[1],
            into_version=into,
            learning_rate=grpo.lr,
            kl_beta=grpo.kl_beta,
        )
    )


def rollbacks_before(ledger, k: int) -> int:
    """How many rollbacks the run made before iteration k's update."""
    return int(ledger.query("SELECT count(*) FROM hacking_rollbacks WHERE iteration < ?", [k]).rows[0][0])


def rolled_back_grpo(grpo, config: HackingGuardConfig, rollbacks: int):
    """The GRPO settings after `rollbacks` rollbacks: lr x rollback_lr_scale^n, KL at least rollback_kl_beta."""
    if rollbacks == 0:
        return grpo
    kl = grpo.kl_beta if config.rollback_kl_beta is None else max(grpo.kl_beta, config.rollback_kl_beta)
    return dataclasses.replace(grpo, lr=grpo.lr * config.rollback_lr_scale**rollbacks, kl_beta=kl)


def guarded_train_config(ctx: RunContext, k: int):
    """The TrainConfig iteration k's update runs with: the run's, with the rollbacks so far applied."""
    n = rollbacks_before(ctx.ledger, k)
    if n == 0:
        return ctx.train
    return dataclasses.replace(ctx.train, grpo=rolled_back_grpo(ctx.train.grpo, guard_config(ctx), n))


def hacking_from_options(
    on_hacking: str | None = None,
    window: int | None = None,
    z: float | None = None,
    max_drop: float | None = None,
    max_rise: float | None = None,
    rollback_lr_scale: float | None = None,
    rollback_kl_beta: float | None = None,
) -> HackingGuardConfig:
    """The HackingGuardConfig of the command-line options (None: the default; `max_drop` 0 turns the drop test
    off); ValueError naming the option, before any compute."""
    rule_changes = {k: v for k, v in {"window": window, "z": z, "max_rise": max_rise}.items() if v is not None}
    if max_drop is not None:
        rule_changes["max_drop"] = None if max_drop == 0 else max_drop
    changes = {"on_hacking": on_hacking, "rollback_lr_scale": rollback_lr_scale, "rollback_kl_beta": rollback_kl_beta}
    return HackingGuardConfig(rule=HackingRule(**rule_changes), **{k: v for k, v in changes.items() if v is not None})


def rejudge(ledger, rule: HackingRule) -> list[tuple[int, bool, str | None]]:
    """(iteration, flagged, rule) of every recorded validation judged again with `rule`, as the run would have,
    rollbacks included: how other settings would have judged a finished run (defaults are chosen this way)."""
    rows = ledger.query("SELECT * FROM hacking_signals ORDER BY iteration").as_dicts()
    out = []
    for row in rows:
        history, base = _history(ledger, row["iteration"])
        now = _signals(row)
        verdict = judge(history + [now], base or now, rule)
        out.append((int(row["iteration"]), verdict.flagged, verdict.rule))
    return out
