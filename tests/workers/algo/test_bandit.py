"""The exploration planner's UCB bandit on a synthetic environment whose best arm is known."""

from __future__ import annotations

import json
import random

import pytest

from workers.algo.bandit import Arm, BanditConfig, UCBBandit, predict_budget_s

# Synthetic arms: (M, level) -> true mean gain, true seconds per prompt. With 8 prompts on 2
# workers and a budget of 20 s, an arm fits when seconds per prompt <= 0.9 * 20 * 2 / 8 = 4.5.
GAIN = {"m16-cheap": 1.3, "m16-mid": 1.5, "m24-cheap": 1.7, "m24-mid": 1.9, "m32-mid": 2.6, "m32-full": 2.9}
COST = {"cheap": 0.125, "mid": 0.16, "full": 0.3}  # seconds per sample: m32-mid (5.1 s) and m32-full (9.6 s) do not fit
BEST_FEASIBLE = "m24-mid"  # 3.84 s per prompt
BUDGET_S, PROMPTS, WORKERS = 20.0, 8, 2


def _true_seconds(arm: Arm) -> float:
    return arm.seeds_per_prompt * COST[arm.cache_level]


def _bandit() -> UCBBandit:
    arms = [Arm.parse(name) for name in GAIN]
    return UCBBandit(arms, BanditConfig(ucb_c=0.5), cost_weights=dict(COST))


def _play(bandit: UCBBandit, rounds: int, rng: random.Random) -> list[str | None]:
    chosen = []
    for _ in range(rounds):
        choice = bandit.choose(BUDGET_S, PROMPTS, WORKERS)
        chosen.append(None if choice.arm is None else choice.arm.name)
        if choice.arm is None:
            continue
        seconds = _true_seconds(choice.arm) * rng.uniform(0.95, 1.05) * PROMPTS
        bandit.observe_time(choice.arm, seconds, PROMPTS)
        bandit.observe_gain(choice.arm, rng.gauss(GAIN[choice.arm.name], 0.4))
    return chosen


def test_the_bandit_converges_to_the_best_arm_that_fits_the_budget() -> None:
    chosen = _play(_bandit(), 200, random.Random(0))
    last = chosen[-80:]
    assert last.count(BEST_FEASIBLE) / len(last) >= 0.8, {a: last.count(a) for a in set(last)}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_choice_fits_the_budget_even_before_the_arm_was_ever_timed(seed: int) -> None:
    for name in _play(_bandit(), 60, random.Random(seed)):
        arm = Arm.parse(name)
        assert _true_seconds(arm) * PROMPTS / WORKERS <= BUDGET_S, f"{name} overran the budget"


def test_the_first_choice_is_the_cheapest_arm_when_nothing_was_timed_or_no_budget_is_known() -> None:
    bandit = _bandit()
    assert bandit.choose(BUDGET_S, PROMPTS, WORKERS).arm.name == "m16-cheap"
    bandit.observe_time(Arm.parse("m24-mid"), 30.0, PROMPTS)
    choice = bandit.choose(None, PROMPTS, WORKERS)
    assert choice.arm.name == "m16-cheap" and "no training time" in choice.reason


def test_no_arm_fitting_the_budget_means_random_seeds_and_says_why() -> None:
    bandit = _bandit()
    bandit.observe_time(Arm.parse("m16-cheap"), 16.0, PROMPTS)  # 2 s per prompt -> even the cheapest needs 8 s
    choice = bandit.choose(budget_s=1.0, num_prompts=PROMPTS, num_workers=WORKERS)
    assert choice.arm is None and "no arm fits" in choice.reason


def test_a_restored_bandit_continues_exactly_where_the_saved_one_was() -> None:
    rng = random.Random(3)
    bandit = _bandit()
    _play(bandit, 25, rng)
    restored = UCBBandit.from_dict(json.loads(json.dumps(bandit.to_dict())))
    state = rng.getstate()
    expected = _play(bandit, 15, rng)
    rng.setstate(state)
    assert _play(restored, 15, rng) == expected


def test_a_gain_far_above_the_cap_counts_only_as_the_cap() -> None:
    bandit = UCBBandit([Arm(16, "cheap")], BanditConfig(gain_cap=5.0))
    bandit.observe_gain(Arm(16, "cheap"), 400.0)
    assert bandit.stats["m16-cheap"].mean_gain == 5.0


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: BanditConfig(safety=0), "safety"),
        (lambda: BanditConfig(ucb_c=-1), "ucb_c"),
        (lambda: Arm(1, "half_steps"), "seeds_per_prompt"),
        (lambda: Arm(16, "half-steps"), "cache_level"),
        (lambda: Arm.parse("sixteen-half_steps"), "m16-half_steps"),
        (lambda: UCBBandit([Arm(16, "a"), Arm(16, "a")]), "distinct"),
        (lambda: _bandit().choose(-1.0, 8, 1), "budget_s"),
        (lambda: _bandit().observe_gain(Arm(99, "cheap"), 1.0), "not one of"),
        (lambda: Arm(16, "half_steps", keep=17), "keep"),
        (lambda: Arm(16, "half_steps", keep=1), "keep"),
        (lambda: Arm.parse("m32-half_steps-12"), "m32-half_steps-w12"),
        (lambda: BanditConfig(min_arm_tau=1.5), "min_arm_tau"),
        (lambda: BanditConfig(min_tau_observations=0), "min_tau_observations"),
    ],
)
def test_bad_settings_are_refused_with_the_field_named(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_the_budget_is_the_median_of_the_last_three_training_times() -> None:
    assert predict_budget_s([]) is None
    assert predict_budget_s([10.0]) == 10.0
    assert predict_budget_s([100.0, 10.0, 12.0, 50.0]) == 12.0  # the oldest is out of the window
    assert predict_budget_s([10.0, 12.0]) == 11.0


def test_a_pre_filter_arm_is_named_by_what_it_keeps_and_parses_back() -> None:
    arm = Arm(32, "half_steps", keep=12)
    assert arm.name == "m32-half_steps-w12" and Arm.parse(arm.name) == arm
    assert arm.kept(8) == 12 and Arm(32, "half_steps").kept(8) == 8
    assert Arm.parse("m16-half_steps") == Arm(16, "half_steps")  # the arms of before keep their names


def test_an_arm_costing_exactly_a_budget_counted_in_samples_fits_but_an_estimated_one_keeps_the_margin() -> None:
    exact = Arm(32, "half_steps")  # 32 x 0.5 = 16 samples per prompt, 8 prompts: exactly 128
    bandit = UCBBandit([Arm(16, "quarter_steps"), exact], cost_weights={"half_steps": 0.5, "quarter_steps": 0.25})
    bandit.observe_gain(Arm(16, "quarter_steps"), 1.0)  # tried: the untried exact arm has the larger bound
    assert bandit.choose(128.0, 8, 1, unit_cost=1.0).arm == exact
    # Timed in seconds (estimates), the same cost does not fit within safety 0.9 of the budget.
    bandit.observe_time(exact, 16.0 * 8, 8)
    bandit.observe_time(Arm(16, "quarter_steps"), 4.0 * 8, 8)
    assert bandit.choose(128.0, 8, 1).arm == Arm(16, "quarter_steps")


def test_an_arm_whose_measured_fidelity_falls_below_the_floor_is_no_longer_chosen() -> None:
    good, bad = Arm(16, "half_steps"), Arm(16, "quarter_steps")
    bandit = UCBBandit(
        [good, bad],
        BanditConfig(min_arm_tau=0.3, min_tau_observations=2),
        cost_weights={"half_steps": 0.5, "quarter_steps": 0.25},
    )
    for arm, gain in ((good, 1.0), (bad, 3.0)):
        bandit.observe_gain(arm, gain)
    assert bandit.choose(100.0, 8, 1, unit_cost=1.0).arm == bad  # the larger gain, fidelity not yet measured
    bandit.observe_tau(bad, 0.1)
    assert bandit.choose(100.0, 8, 1, unit_cost=1.0).arm == bad  # one measurement is not enough to drop it
    bandit.observe_tau(bad, 0.2)
    choice = bandit.choose(100.0, 8, 1, unit_cost=1.0)
    assert choice.arm == good and "1 below the fidelity floor" in choice.reason
    bandit.observe_tau(good, 0.0)
    bandit.observe_tau(good, 0.1)
    assert bandit.choose(100.0, 8, 1, unit_cost=1.0).arm is None  # every arm dropped: random seeds
    restored = UCBBandit.from_dict(json.loads(json.dumps(bandit.to_dict())))
    assert restored.dropped(good) and restored.dropped(bad)


def test_a_state_saved_before_fidelity_was_measured_still_loads() -> None:
    state = _bandit().to_dict()
    for stats in state["stats"].values():
        del stats["tau_sum"], stats["tau_count"]
    del state["config"]["min_arm_tau"], state["config"]["min_tau_observations"]
    assert UCBBandit.from_dict(state).stats["m16-cheap"].mean_tau is None
