"""`spotlight bench dead-share`: the headroom seed selection has on a task, before any training run."""

from __future__ import annotations

import dataclasses

import pytest

from workers.bench.dead_share import dead_share
from workers.trainer.presets import get_preset


def test_a_group_picked_from_the_candidates_is_dead_only_where_every_random_group_is() -> None:
    from workers.model.tiny_policy import SHIPPED_BASE, load_policy

    config = dataclasses.replace(get_preset("cpu_tiny_lowpass"), prompts_per_iteration=3)
    figures = dead_share(load_policy(SHIPPED_BASE), config, iterations=1, num_candidates=8)
    assert figures["reward"] == "minigeneval_strict" and figures["group_size"] == 4 and figures["num_prompts"] == 3
    assert set(figures["per_category"]) == {"position", "counting_binding", "color_binding"}
    assert 0.0 <= figures["picked_dead_share"] <= figures["random_dead_share"] <= 1.0
    for category in figures["per_category"].values():
        assert category["picked_dead_share"] <= category["random_dead_share"]


def test_too_few_candidates_for_two_groups_are_refused_before_any_compute() -> None:
    with pytest.raises(ValueError, match="num_candidates"):
        dead_share(None, get_preset("cpu_tiny_lowpass"), iterations=1, num_candidates=4)
