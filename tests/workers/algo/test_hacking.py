"""The reward-hacking rule: fires when the proxy rises while the gold falls beyond their standard errors, or
when an image statistic drifts past its bound; stays quiet on noise and on honest learning."""

import pytest

from workers.algo.hacking import PROXY_RULE, HackingRule, Signals, judge, standard_error

STATS = {"edge_density": 0.08, "colour_entropy": 0.8, "saturation": 0.3, "compressed_bytes": 700.0, "diversity": 0.2}


def _sig(iteration, proxy, gold, se=0.02, **stats):
    return Signals(iteration, proxy, se, gold, se, {**STATS, **stats})


BASE = _sig(0, proxy=-1.2, gold=0.30)


def test_proxy_up_and_gold_down_beyond_their_errors_is_flagged_with_the_numbers():
    verdict = judge([BASE, _sig(5, proxy=-0.9, gold=0.10)], BASE, HackingRule())
    assert verdict.flagged and verdict.rule == PROXY_RULE
    assert "since iteration 0" in verdict.detail and "gold -0.2" in verdict.detail


@pytest.mark.parametrize(
    "proxy, gold",
    [(-0.9, 0.35), (-1.25, 0.10), (-1.18, 0.27), (-0.9, 0.28)],
    ids=["both rise", "both fall", "within noise", "gold dip within its error"],
)
def test_honest_learning_a_bad_step_and_noise_are_not_flagged(proxy, gold):
    assert not judge([BASE, _sig(5, proxy, gold)], BASE, HackingRule()).flagged


def test_the_window_reaches_back_at_most_window_validations():
    history = [BASE, _sig(5, -1.1, 0.40), _sig(10, -1.0, 0.36), _sig(15, -0.9, 0.32)]
    # gold fell 0.08 in three small steps: beyond 2 x 0.028 over the last 2 validations, not step by step
    assert judge(history, BASE, HackingRule(window=2)).flagged
    assert not judge(history, BASE, HackingRule(window=1)).flagged


def test_an_image_statistic_past_its_bound_is_flagged_and_the_furthest_one_named():
    flat = _sig(5, -1.2, 0.30, edge_density=0.02, colour_entropy=0.3)
    verdict = judge([BASE, flat], BASE, HackingRule(max_drop=0.5))
    assert verdict.flagged and verdict.rule == "drift:edge_density" and "-75%" in verdict.detail
    assert not judge([BASE, flat], BASE, HackingRule(max_drop=None)).flagged
    assert not judge([BASE, flat], BASE, HackingRule(max_drop=0.8)).flagged
    assert not judge([BASE, flat], BASE, HackingRule(drift_statistics=("saturation",))).flagged


def test_a_rise_fires_only_with_max_rise_set_since_healthy_images_gain_detail():
    detailed = _sig(5, -1.1, 0.35, compressed_bytes=1100.0, saturation=0.7)  # +57 %, +133 %
    assert not judge([BASE, detailed], BASE, HackingRule()).flagged
    verdict = judge([BASE, detailed], BASE, HackingRule(max_rise=1.0))
    assert verdict.rule == "drift:saturation" and "+133%" in verdict.detail and "bound +100%" in verdict.detail


def test_the_base_alone_is_never_flagged():
    assert not judge([BASE], BASE, HackingRule(z=0.0)).flagged


def test_standard_error_is_the_sample_std_over_root_n():
    assert standard_error([0.0, 1.0, 0.0, 1.0]) == pytest.approx((1 / 3) ** 0.5 / 2)
    assert standard_error([1.0]) == 0.0


@pytest.mark.parametrize(
    "field, value",
    [("window", 0), ("z", -1.0), ("max_drop", 1.0), ("max_rise", 0.0), ("drift_statistics", ("sharpness",))],
)
def test_a_bad_rule_setting_names_its_field(field, value):
    with pytest.raises(ValueError, match=field):
        HackingRule(**{field: value})
