"""Golden runs: `spotlight train` and `spotlight run` give the same numbers as the fixtures recorded
before the layout change (tests/golden.py; timings and dollars excluded)."""

import json

import pytest

from tests.golden import fixture_path, mismatches, produce


@pytest.mark.parametrize("kind", ["train", "run"])
def test_cpu_smoke_output_equals_the_golden_fixture(kind, tmp_path):
    expected = json.loads(fixture_path(kind).read_text())
    assert mismatches(json.loads(json.dumps(produce(kind, tmp_path))), expected) == []


def test_the_golden_comparison_allows_only_what_another_cpus_kernels_change():
    """A training number off by 0.1 %, a reward or a prompt is a change of behaviour; a flipped held-out image
    (1 of 16 in a category) or another rollout hash is what another CPU's float kernels give (tests/golden.py)."""
    train = json.loads(fixture_path("train").read_text())
    run = json.loads(fixture_path("run").read_text())

    def edited(digest, edit):
        copy = json.loads(json.dumps(digest))
        edit(copy)
        return mismatches(copy, digest)

    assert edited(train, lambda d: d[0].update(grad_norm=d[0]["grad_norm"] * 1.001))
    assert edited(train, lambda d: d[1].update(reward_mean=d[1]["reward_mean"] + 1 / 8))
    assert edited(train, lambda d: d.pop())
    assert not edited(train, lambda d: d[1]["validation_per_category"].update(counting=0.5625))
    assert edited(train, lambda d: d[1]["validation_per_category"].update(counting=0.625))
    assert not edited(run, lambda d: d["requests"][0].__setitem__(7, "0" * 32))
    assert edited(run, lambda d: d["requests"][0].__setitem__(8, 0.25))  # the request's reward
    assert edited(run, lambda d: d["requests"][0].__setitem__(3, "a red circle"))  # the request's prompt
    assert edited(run, lambda d: d["syncs"][1].__setitem__(4, d["syncs"][1][4] * 2))  # a patch twice the size


def test_spotlight_train_and_the_pipeline_are_one_driver_with_one_numbering():
    """Iteration k of `spotlight train` is iteration k of the pipeline: the same update of weights v(k) into
    v(k+1) (reward, loss, gradient norm) and the same held-out score of v(k)."""
    train = json.loads(fixture_path("train").read_text())
    run = json.loads(fixture_path("run").read_text())
    steps = {row[0]: row for row in run["train_steps"]}  # iteration, step, loss, kl, reward_mean, reward_std, ...
    assert [r["iteration"] for r in train if "reward_mean" in r] == sorted(steps)
    for record in train:
        if "reward_mean" in record:
            _, _, loss, kl, reward_mean, reward_std, zero_std, _, grad_norm, lr = steps[record["iteration"]]
            assert (record["loss"], record["kl"], record["reward_mean"], record["reward_std"], record["zero_std_ratio"],
                    record["grad_norm"], record["learning_rate"]) == (loss, kl, reward_mean, reward_std, zero_std,
                                                                      grad_norm, lr)
    assert [(r["iteration"], r["validation_score"]) for r in train] == [(k, score) for k, _, score, _ in run["validation"]]
