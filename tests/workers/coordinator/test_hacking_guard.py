"""The validate phase's reward-hacking guard: signals and verdicts in the ledger's `reward_hacking` view, and what
a flag does (warn, stop, rollback to the best-gold weights with a lower learning rate and a stronger KL)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from resources.keys import weights_key
from resources.ledger.records import HackingSignalsRecord
from workers.coordinator.context import RunContext
from workers.coordinator.hacking_guard import (
    HackingGuardConfig,
    guard_validation,
    guarded_train_config,
    hacking_from_options,
    held_out_signals,
)
from workers.trainer.checkpoint import load_checkpoint, save_checkpoint
from workers.trainer.presets import get_preset

RUN = "guarded"


def _ctx(store, ledger, **guard) -> RunContext:
    return RunContext(
        RUN, "cpu_tiny", get_preset("cpu_tiny"), store, ledger, None, store.url, hacking=HackingGuardConfig(**guard)
    )


def _signals(k, proxy, gold, se=0.02, edge_density=0.08) -> HackingSignalsRecord:
    return HackingSignalsRecord(
        iteration=k,
        weights_version=k,
        proxy_reward="jpeg_compressibility",
        proxy=proxy,
        proxy_se=se,
        gold_reward="minigeneval",
        gold=gold,
        gold_se=se,
        edge_density=edge_density,
        colour_entropy=0.8,
        saturation=0.3,
        compressed_bytes=700.0,
    )


def _save_perturbed(store, policy, version: int) -> dict[str, torch.Tensor]:
    """Checkpoint `version` as the policy with every weight shifted by `version` / 100 (a distinct version)."""
    weights = {name: t + version / 100 if t.is_floating_point() else t for name, t in policy.weights().items()}
    policy.load_weights(weights)
    save_checkpoint(store, RUN, version, policy)
    return weights


def _same(store, version: int, weights: dict[str, torch.Tensor]) -> bool:
    loaded = load_checkpoint(store, RUN, version)[0].weights()
    return all(torch.equal(loaded[name], weights[name]) for name in weights)


def test_rollback_publishes_the_best_gold_weights_as_the_next_version_and_trains_on_gentler(
    tmp_store, mem_ledger, tiny_policy
):
    ctx = _ctx(tmp_store, mem_ledger, on_hacking="rollback", rollback_kl_beta=0.02)
    base = _save_perturbed(tmp_store, tiny_policy, 0)
    for _ in range(2):  # a redone validation replaces its row
        assert guard_validation(ctx, 0, _signals(0, proxy=-1.2, gold=0.30))[1] is None
    assert mem_ledger.query("SELECT count(*) FROM reward_hacking").rows == [(1,)]
    best = _save_perturbed(tmp_store, tiny_policy, 1)
    verdict, action = guard_validation(ctx, 1, _signals(1, proxy=-1.1, gold=0.40))  # better gold: kept as best
    assert not verdict.flagged and action is None
    _save_perturbed(tmp_store, tiny_policy, 2)
    _save_perturbed(tmp_store, tiny_policy, 3)  # the train phase wrote v3 before v2 is validated
    tmp_store.delete_commit(weights_key(RUN, 1))  # the trainer keeps only its last two checkpoints

    verdict, action = guard_validation(ctx, 2, _signals(2, proxy=-0.8, gold=0.10))
    assert verdict.flagged and verdict.rule == "proxy_up_gold_down" and action == "rollback"
    assert _same(tmp_store, 3, best) and not _same(tmp_store, 3, base)
    lr = ctx.train.grpo.lr
    assert guarded_train_config(ctx, 2).grpo == ctx.train.grpo  # the update that made v3 already ran
    assert (guarded_train_config(ctx, 3).grpo.lr, guarded_train_config(ctx, 3).grpo.kl_beta) == (lr / 2, 0.02)
    row = mem_ledger.query(
        "SELECT flagged, rule, action, round(gold_change, 6), restored_version, restored_gold, "
        "rollback_learning_rate, rollback_kl_beta FROM reward_hacking WHERE iteration = 2"
    ).rows
    assert row == [(True, "proxy_up_gold_down", "rollback", -0.2, 1, 0.4, lr / 2, 0.02)]


def test_after_a_rollback_the_rule_compares_with_the_restored_weights(tmp_store, mem_ledger, tiny_policy):
    ctx = _ctx(tmp_store, mem_ledger, on_hacking="rollback")
    for k in range(3):
        _save_perturbed(tmp_store, tiny_policy, k)
    guard_validation(ctx, 0, _signals(0, proxy=-1.2, gold=0.30))
    assert guard_validation(ctx, 1, _signals(1, proxy=-0.8, gold=0.10))[1] == "rollback"  # v2 := v0
    # v2 scores like v0 (its weights are v0's): measured against the flagged v1 it would look like a recovery,
    # against v0 it is no change; a second rollback needs a new rise of the proxy with a fall of the gold.
    assert not guard_validation(ctx, 2, _signals(2, proxy=-1.2, gold=0.30))[0].flagged
    assert mem_ledger.query("SELECT count(*) FROM hacking_rollbacks").rows == [(1,)]
    assert guarded_train_config(ctx, 2).grpo.lr == ctx.train.grpo.lr / 2
    assert guarded_train_config(ctx, 2).grpo.kl_beta == ctx.train.grpo.kl_beta  # no rollback_kl_beta given


@pytest.mark.parametrize("on_hacking", ["warn", "stop"])
def test_warn_and_stop_record_the_flag_and_leave_the_weights_and_the_training_alone(
    on_hacking, tmp_store, mem_ledger, tiny_policy
):
    ctx = _ctx(tmp_store, mem_ledger, on_hacking=on_hacking)
    for k in range(3):
        _save_perturbed(tmp_store, tiny_policy, k)
    v2 = load_checkpoint(tmp_store, RUN, 2)[0].weights()
    guard_validation(ctx, 0, _signals(0, proxy=-1.2, gold=0.30))
    verdict, action = guard_validation(ctx, 1, _signals(1, proxy=-1.2, gold=0.30, edge_density=0.02))
    assert verdict.rule == "drift:edge_density" and action == on_hacking
    assert _same(tmp_store, 2, v2) and guarded_train_config(ctx, 2) == ctx.train
    assert mem_ledger.query("SELECT flagged, action FROM reward_hacking ORDER BY iteration").rows == [
        (False, None),
        (True, on_hacking),
    ]


def test_held_out_signals_score_the_images_with_the_training_reward_and_measure_them(tmp_store, mem_ledger):
    from workers.task.evaluate import EvalResult
    from workers.task.rewards import jpeg_compressibility

    ctx = _ctx(tmp_store, mem_ledger)
    ctx.train = dataclasses.replace(ctx.train, reward="jpeg_compressibility")
    images = np.random.default_rng(0).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8)
    prompts = ["a red circle"] * 2 + ["two blue squares"] * 2
    result = EvalResult(score=0.5, partial=None, images=images, prompts=prompts, scores=[0.0, 1.0, 1.0, 0.0])
    record = held_out_signals(ctx, 3, result, "minigeneval_strict", seeds=2)
    assert record.proxy == pytest.approx(jpeg_compressibility(images, prompts).mean())
    assert (record.gold, record.gold_se) == (0.5, pytest.approx(np.std([0, 1, 1, 0], ddof=1) / 2))
    assert record.diversity > 0.2 and record.edge_density > 0.3  # uniform noise: every pixel differs


@pytest.mark.parametrize(
    "options, field",
    [
        ({"on_hacking": "ignore"}, "on_hacking"),
        ({"window": 0}, "window"),
        ({"rollback_lr_scale": 2.0}, "rollback_lr_scale"),
        ({"rollback_kl_beta": -1.0}, "rollback_kl_beta"),
    ],
)
def test_a_bad_guard_option_names_itself(options, field):
    with pytest.raises(ValueError, match=field):
        hacking_from_options(**options)
    assert hacking_from_options(max_drop=0).rule.max_drop is None  # 0 turns the drop test off


def test_a_rollback_on_the_final_iteration_replaces_the_final_weights(tmp_store, mem_ledger, tiny_policy):
    ctx = _ctx(tmp_store, mem_ledger, on_hacking="rollback")
    ctx.train = dataclasses.replace(ctx.train, iterations=1)  # iteration 1 is the final one
    base = _save_perturbed(tmp_store, tiny_policy, 0)
    _save_perturbed(tmp_store, tiny_policy, 1)
    guard_validation(ctx, 0, _signals(0, proxy=-1.2, gold=0.30))
    assert guard_validation(ctx, 1, _signals(1, proxy=-0.8, gold=0.10))[1] == "rollback"
    assert _same(tmp_store, 1, base)  # what `spotlight train --out` saves as the trained policy
    assert mem_ledger.query("SELECT restored_version, into_version FROM hacking_rollbacks").rows == [(0, 1)]


def test_the_report_plots_proxy_against_gold_and_lists_each_flag_with_what_the_run_did(
    tmp_store, mem_ledger, tiny_policy, tmp_path
):
    from workers.coordinator.report import write_report

    ctx = _ctx(tmp_store, mem_ledger, on_hacking="rollback")
    for k in range(3):
        _save_perturbed(tmp_store, tiny_policy, k)
    guard_validation(ctx, 0, _signals(0, proxy=-1.2, gold=0.30))
    guard_validation(ctx, 1, _signals(1, proxy=-0.8, gold=0.10))
    written = write_report(mem_ledger, tmp_store, RUN, tmp_path / "report")
    page = written.index.read_text()
    assert written.plots["hacking"].startswith(b"\x89PNG") and (tmp_path / "report" / "hacking.png").is_file()
    assert (tmp_path / "report" / "components.png").is_file()
    assert "1 of 2 validation(s) flagged" in page and "proxy_up_gold_down" in page and "rolled back to v0" in page
