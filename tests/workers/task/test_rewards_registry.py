"""Reward specs: registered names, parametrised kind:ARG specs, and the messages a bad spec gets."""

from __future__ import annotations

import numpy as np
import pytest

from workers.task import rewards
from workers.task.rewards import get_reward, register_reward, register_reward_kind, score_with_components


@pytest.fixture
def scratch_registry(monkeypatch):
    """Rewards registered by a test vanish after it."""
    monkeypatch.setattr(rewards, "_REGISTRY", dict(rewards._REGISTRY))
    monkeypatch.setattr(rewards, "_KINDS", dict(rewards._KINDS))
    monkeypatch.setattr(rewards, "_BUILT", {})


def test_an_unknown_spec_names_the_registered_rewards_and_kinds():
    for spec in ("pickscor", "nokind:/models/x", "minigeneval:x"):
        with pytest.raises(ValueError) as err:
            get_reward(spec)
        message = str(err.value)
        assert repr(spec) in message and "minigeneval" in message
        assert all(kind in message for kind in ("clip", "multi", "pickscore", "remote", "http://"))


def test_a_kind_without_an_argument_is_refused():
    with pytest.raises(ValueError, match="needs an argument"):
        get_reward("clip:")


def test_a_parametrised_spec_is_built_once_per_process(scratch_registry):
    built = []

    def factory(arg):
        built.append(arg)
        return lambda images, prompts: np.full(len(images), float(arg))

    register_reward_kind("const", factory)
    assert get_reward("const:2.5") is get_reward("const:2.5")
    assert built == ["2.5"]
    images = np.zeros((3, 4, 4, 3), np.uint8)
    total, parts = score_with_components(get_reward("const:2.5"), images, ["a"] * 3)
    np.testing.assert_array_equal(total, [2.5, 2.5, 2.5])
    assert parts == {}


def test_replacing_a_reward_rebuilds_multi_rewards_that_use_it(scratch_registry):
    register_reward("fixed", lambda images, prompts: np.ones(len(images)))
    images = np.zeros((2, 4, 4, 3), np.uint8)
    assert get_reward("multi:fixed=2")(images, ["a", "b"]).tolist() == [2.0, 2.0]
    register_reward("fixed", lambda images, prompts: np.zeros(len(images)))
    assert get_reward("multi:fixed=2")(images, ["a", "b"]).tolist() == [0.0, 0.0]


def test_a_reward_returning_the_wrong_number_of_values_is_caught(scratch_registry):
    register_reward("short", lambda images, prompts: np.ones(len(images) - 1))
    with pytest.raises(ValueError, match="expected one float each"):
        score_with_components(get_reward("short"), np.zeros((3, 4, 4, 3), np.uint8), ["a"] * 3)


def test_kind_names_cannot_shadow_urls():
    with pytest.raises(ValueError, match="URLs"):
        register_reward_kind("http", lambda arg: None)
