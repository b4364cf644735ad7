"""Per-component advantages: each multi-reward component normalised within its group, then weighted."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.algo.advantages import component_advantages
from workers.algo.grpo import GRPOConfig, group_advantages, normalised_deviations

values = st.floats(min_value=-100.0, max_value=100.0, allow_nan=False, allow_subnormal=False)
weights = st.floats(min_value=0.01, max_value=100.0)


@st.composite
def grouped(draw, components: int = 1):
    """Group ids (2..5 groups of 2..6 samples) and `components` value vectors over them."""
    sizes = draw(st.lists(st.integers(2, 6), min_size=2, max_size=5))
    group_ids = torch.tensor([g for g, n in enumerate(sizes) for _ in range(n)])
    n = len(group_ids)
    vectors = [
        torch.tensor(draw(st.lists(values, min_size=n, max_size=n)), dtype=torch.float64) for _ in range(components)
    ]
    return group_ids, vectors


@settings(max_examples=200, deadline=None)
@given(grouped(), weights, st.sampled_from(["group", "batch"]))
def test_with_one_component_the_advantages_are_todays(data, weight, norm):
    group_ids, (a,) = data
    per_component = component_advantages({"a": a}, {"a": weight}, group_ids, norm=norm)
    assert torch.allclose(per_component, group_advantages(a, group_ids, norm=norm), atol=1e-5)


@settings(max_examples=200, deadline=None)
@given(grouped(components=2), weights, weights, values)
def test_a_component_tied_within_a_group_contributes_nothing_there(data, w_a, w_b, tie):
    group_ids, (a, b) = data
    b[group_ids == 0] = tie  # component b ranks nothing in group 0
    adv = component_advantages({"a": a, "b": b}, {"a": w_a, "b": w_b}, group_ids)
    alone = (w_a * normalised_deviations(a, group_ids) / (w_a + w_b)).clamp(-5, 5).float()
    assert torch.allclose(adv[group_ids == 0], alone[group_ids == 0], atol=1e-5)


def test_a_component_with_a_small_spread_still_moves_the_advantages():
    """Summed, a reward in [0, 10] drowns one that differs by 0.1: the total's advantages barely tell two samples
    apart that differ only in the small one. Per component, that difference counts as much as the large one's."""
    group_ids = torch.zeros(4, dtype=torch.long)
    big = torch.tensor([0.0, 10.0, 0.0, 10.0])
    small = torch.tensor([0.0, 0.0, 0.1, 0.1])
    total = group_advantages(big + small, group_ids)
    per_component = component_advantages({"big": big, "small": small}, {"big": 1.0, "small": 1.0}, group_ids)
    assert float(total[2] - total[0]) < 0.03  # the small component's gain is lost in the sum
    assert torch.allclose(per_component, torch.tensor([-1.0, 0.0, 0.0, 1.0]), atol=5e-3)
    assert float(per_component[2] - per_component[0]) == pytest.approx(1.0, abs=5e-3)


def test_a_negative_weight_penalises_its_component():
    group_ids = torch.zeros(2, dtype=torch.long)
    adv = component_advantages({"cost": torch.tensor([1.0, 2.0])}, {"cost": -1.0}, group_ids)
    assert float(adv[0]) > 0 > float(adv[1])


def test_bad_weights_or_missing_components_are_refused():
    group_ids = torch.zeros(2, dtype=torch.long)
    a = torch.tensor([0.0, 1.0])
    with pytest.raises(ValueError, match=r"\['b'\] have no values"):
        component_advantages({"a": a}, {"a": 1.0, "b": 1.0}, group_ids)
    with pytest.raises(ValueError, match="not all zero"):
        component_advantages({"a": a}, {"a": 0.0}, group_ids)
    with pytest.raises(ValueError, match="finite"):
        component_advantages({"a": a}, {"a": float("nan")}, group_ids)
    with pytest.raises(ValueError, match="advantage must be one of"):
        GRPOConfig(advantage="per_prompt")
