"""multi: rewards: the weighted total, each component reported, per-batch z-scores, and the trainer's stats."""

from __future__ import annotations

import numpy as np
import pytest

from workers.task import rewards
from workers.task.rewards import get_reward, register_reward, score_with_components
from workers.task.rewards_multi import parse_multi_spec

IMAGES = np.random.default_rng(0).integers(0, 256, (6, 16, 16, 3), dtype=np.uint8)
PROMPTS = ["a red circle"] * 6


@pytest.fixture
def two_rewards(monkeypatch):
    """'big': spread in the thousands; 'small': spread of about 1, ranking the images the other way."""
    monkeypatch.setattr(rewards, "_REGISTRY", dict(rewards._REGISTRY))
    monkeypatch.setattr(rewards, "_BUILT", {})
    register_reward("big", lambda images, prompts: 1000.0 * images.mean(axis=(1, 2, 3)))
    register_reward("small", lambda images, prompts: -images.mean(axis=(1, 2, 3)) / 100.0)


def test_the_total_is_the_weighted_sum_and_each_component_is_reported(two_rewards):
    total, parts = score_with_components(get_reward("multi:big=1.0,small=0.5"), IMAGES, PROMPTS)
    np.testing.assert_allclose(total, parts["big"] + 0.5 * parts["small"])
    np.testing.assert_allclose(parts["big"], get_reward("big")(IMAGES, PROMPTS))
    np.testing.assert_allclose(parts["small"], get_reward("small")(IMAGES, PROMPTS))
    assert get_reward("multi:big=1.0,small=0.5")(IMAGES, PROMPTS).tolist() == total.tolist()


def test_zscore_keeps_a_large_scale_reward_from_drowning_a_small_one(two_rewards):
    raw = get_reward("multi:big=1,small=1")(IMAGES, PROMPTS)
    normalized = get_reward("multi:big=1,small=1,normalize=zscore")(IMAGES, PROMPTS)
    big = get_reward("big")(IMAGES, PROMPTS)
    assert np.corrcoef(raw, big)[0, 1] > 0.999  # the plain sum is just 'big'
    np.testing.assert_allclose(normalized, 0.0, atol=1e-9)  # z-scored, two opposite rankings cancel
    lean = get_reward("multi:big=1,small=3,normalize=zscore")(IMAGES, PROMPTS)
    assert np.corrcoef(lean, big)[0, 1] < -0.999  # now the weights decide: 'small' counts three times


def test_zscore_refuses_a_single_image_instead_of_returning_zero(two_rewards):
    with pytest.raises(ValueError, match="at least 2 images"):
        get_reward("multi:big=1,small=1,normalize=zscore")(IMAGES[:1], PROMPTS[:1])


def test_the_json_form_names_components_whose_specs_hold_commas(two_rewards):
    spec = 'multi:{"weights": {"b": 2, "s": 1}, "rewards": {"b": "big", "s": "multi:small=1,big=0"}}'
    total, parts = score_with_components(get_reward(spec), IMAGES, PROMPTS)
    assert sorted(parts) == ["b", "s"]
    np.testing.assert_allclose(total, 2 * get_reward("big")(IMAGES, PROMPTS) + get_reward("small")(IMAGES, PROMPTS))


@pytest.mark.parametrize(
    "spec, message",
    [
        ("minigeneval", "write SPEC=WEIGHT"),
        ("minigeneval=high", "must be a number"),
        ("minigeneval=nan", "finite"),
        ("minigeneval=1,minigeneval=2", "unique"),
        ("minigeneval=1,normalize=rank", "normalize must be one of"),
        ('{"weights": {"a": 1}, "extra": 2}', "unexpected keys: \\['extra'\\]"),
        ('{"weights": {"a": 1}, "rewards": {"b": "minigeneval"}}', "have no weight"),
        ('{"weights": [1]', "does not parse"),
    ],
)
def test_malformed_multi_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_multi_spec(spec)


def test_an_unknown_component_fails_when_the_spec_is_resolved():
    with pytest.raises(ValueError, match="unknown reward 'pickscor'"):
        get_reward("multi:minigeneval=1,pickscor=0.5")


def test_the_trainer_reports_each_component_mean(tiny_policy):
    from workers.algo.sampler import SamplerConfig
    from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig

    config = TrainConfig(
        prompts_per_iteration=2,
        group_size=2,
        rollouts_per_prompt=3,
        sampler=SamplerConfig(num_steps=2),
        reward="multi:minigeneval=1.0,jpeg_compressibility=0.1",
    )
    trainer = GRPOTrainer(tiny_policy, config)
    batch = trainer.collect(0)
    stats = trainer.batch_stats(batch)
    parts = batch.reward_components
    assert len(parts["jpeg_compressibility"]) == 6 and batch.rewards.shape == (4,)  # drawn 3 per prompt, kept 2
    assert stats["reward/minigeneval"] == pytest.approx(float(parts["minigeneval"].mean()))
    assert stats["reward/jpeg_compressibility"] == pytest.approx(float(parts["jpeg_compressibility"].mean()))
    assert stats["reward_mean"] == pytest.approx(
        stats["reward/minigeneval"] + 0.1 * stats["reward/jpeg_compressibility"], rel=1e-5
    )
