"""The recipe features where the run uses them: the trainer and the queue requests sample and train on the
iteration's random SDE window, a same-noise group starts from one noise in-process and on a worker, the trainer keeps
the EMA of its weights, a checkpoint saves it and validation scores it (flow_grpo's train_sd3.py `eval` /
`save_ckpt`) at the evaluation guidance and steps."""

from __future__ import annotations

import dataclasses

import torch

from workers.algo.ema import EMAConfig
from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.coordinator.rollout import iteration_requests
from workers.explore.seed_plan import default_seed_plan
from workers.rollout.state import InFlight, RolloutSpec
from workers.sp.node_groups import SPRequest
from workers.trainer.checkpoint import publish_checkpoint
from workers.trainer.ema_weights import evaluated_policy, saved_ema
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig


def _config(**fields) -> TrainConfig:
    return TrainConfig(
        prompts_per_iteration=2,
        group_size=3,
        reward="jpeg_compressibility",
        sampler=SamplerConfig(num_steps=4, noise_level=0.7),
        grpo=GRPOConfig(lr=1e-3, num_minibatches=1),
        **fields,
    )


def _sde_rows(batch) -> list[int]:
    return [
        t for t in range(batch.trajectory.log_probs.shape[0]) if torch.isfinite(batch.trajectory.log_probs[t]).all()
    ]


def test_each_iteration_samples_trains_and_queues_its_own_random_sde_window(tiny_policy):
    config = _config(sde_window_size=2, sde_window_range=(0, 4))
    windows = {k: config.sampler_at(k).sde_window for k in range(8)}
    assert len(set(windows.values())) > 1 and all(b - a == 2 and 0 <= a <= 2 for a, b in windows.values())
    trainer = GRPOTrainer(tiny_policy, config)
    for k in (0, 1):
        batch = trainer.collect(k)
        a, b = windows[k]
        assert _sde_rows(batch) == list(range(a, b))  # log-probs on the window's steps only
        assert trainer.update(batch)["optimizer_steps"] == 1  # trained on those steps (NaN elsewhere would be NaN)
        requests = iteration_requests(config, "demo", k, weights_version=k, plan=default_seed_plan(config, k))
        assert {r.spec.sampler.sde_window for r in requests} == {(a, b)}  # workers sample the same window
    assert _config().sampler_at(5) == _config().sampler  # no random window: the sampler as configured


def test_a_same_noise_group_starts_from_one_noise_in_process_and_on_a_worker(tiny_policy):
    config = _config(init_same_noise=True)
    batch = GRPOTrainer(tiny_policy, config).collect(0)
    first = batch.trajectory.latents[0]
    assert all(torch.equal(first[0], first[j]) for j in (1, 2))  # group 0 shares its noise
    assert not torch.equal(first[0], first[3])  # group 1 has another
    requests = iteration_requests(config, "demo", 0, weights_version=0, plan=default_seed_plan(config, 0))
    assert [r.spec.init_seed for r in requests] == [config.group_init_seed(0, r.prompt_index) for r in requests]
    flight = InFlight.fresh(requests[1].spec, tuple(first.shape[1:]))
    assert torch.equal(flight.latents[0][0], first[1])  # a worker starts sample 1 where the trainer did
    spec = requests[1].spec
    assert RolloutSpec.from_payload(spec.to_payload()) == spec
    assert SPRequest.from_payload("r", spec.to_payload()).init_seed == spec.init_seed  # an SP group's request too
    plain = dataclasses.replace(spec, init_seed=None)
    assert "init_seed" not in plain.to_payload()  # requests without it keep the payload (and fingerprint) they had
    assert _config().group_init_seed(0, 0) is None


def test_the_trainer_keeps_an_ema_of_its_weights_at_the_configured_interval(tiny_policy):
    before = {k: v.clone() for k, v in tiny_policy.weights().items()}
    follows = GRPOTrainer(tiny_policy, _config(ema=EMAConfig(decay=0.0, every=1)))
    follows.update(follows.collect(0))
    after = {k: v.clone() for k, v in tiny_policy.weights().items()}
    assert any(not torch.equal(before[k], after[k]) for k in after)
    assert all(torch.equal(follows.ema_weights[k], after[k].float()) for k in after)  # decay 0: the weights
    lags = GRPOTrainer(tiny_policy, _config(ema=EMAConfig(decay=0.9, every=1000)))
    lags.update(lags.collect(1))
    assert all(torch.equal(lags.ema_weights[k], after[k].float()) for k in after)  # not due: where it started
    assert any(not torch.equal(tiny_policy.weights()[k], after[k]) for k in after)  # while the weights moved on
    assert GRPOTrainer(tiny_policy, _config()).ema_weights is None


def test_a_checkpoint_saves_the_ema_and_validation_scores_it_then_gets_the_live_weights_back(tiny_policy, tmp_store):
    live = {k: v.clone() for k, v in tiny_policy.weights().items()}
    ema = {k: v.float() + 0.5 for k, v in live.items()}
    publish_checkpoint(tmp_store, "demo", 1, tiny_policy.spec(), live, None, ema=ema)
    publish_checkpoint(tmp_store, "demo", 2, tiny_policy.spec(), live, None)
    assert saved_ema(tmp_store, "demo", 2) is None
    assert all(torch.equal(saved_ema(tmp_store, "demo", 1)[k], ema[k]) for k in ema)
    train = _config(ema=EMAConfig(), validation_steps=6)
    with evaluated_policy(tiny_policy, train, tmp_store, "demo", 1) as (scored, sampler):
        assert all(torch.equal(scored.weights()[k], ema[k]) for k in ema)
        assert sampler.num_steps == 6 and sampler.sde_window is None
    assert all(torch.equal(tiny_policy.weights()[k], live[k]) for k in live)
    with evaluated_policy(tiny_policy, _config(), tmp_store, "demo", 1) as (scored, sampler):
        assert all(torch.equal(scored.weights()[k], live[k]) for k in live)  # train.ema off: the live weights
        assert sampler == _config().sampler
