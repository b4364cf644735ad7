"""Golden runs: `spotlight train` (GRPO and the default NFT objective) and `spotlight run` give the fixtures'
numbers (tests/golden.py: timings and dollars excluded; bit for bit on the kernels the fixtures were recorded on),
and `spotlight train`'s records equal the pipeline's ledger rows of the same run, live."""

import json

from tests.golden import compare, fixture_path, ledger_digest, mismatches, train_digest


def test_cpu_smoke_train_equals_the_golden_fixture(smoke_train):
    assert compare(train_digest(smoke_train.stdout), "train") == []


def test_the_default_nft_objective_equals_its_golden_fixture(smoke_nft_train):
    records = train_digest(smoke_nft_train.stdout)
    assert [r["iteration"] for r in records] == [0, 1, 2] and records[0]["fm_loss"] > 0  # the NFT loss ran
    assert compare(records, "train_nft") == []


def test_cpu_smoke_pipeline_ledger_equals_the_golden_fixture(smoke_run):
    assert compare(ledger_digest(smoke_run.path("rel/run") / "ledger.duckdb"), "run") == []


def test_the_golden_comparison_allows_only_what_another_cpus_kernels_change():
    """A training number off by 0.1 %, a reward or a prompt is a change of behaviour; flipped held-out images
    (2 of 16 in a category) or another rollout hash is what another CPU's float kernels give (tests/golden.py)."""
    train = json.loads(fixture_path("train").read_text())
    run = json.loads(fixture_path("run").read_text())

    def edited(digest, edit):
        copy = json.loads(json.dumps(digest))
        edit(copy)
        return mismatches(copy, digest)

    assert edited(train, lambda d: d[0].update(grad_norm=d[0]["grad_norm"] * 1.001))
    assert edited(train, lambda d: d[1].update(reward_mean=d[1]["reward_mean"] + 1 / 8))
    assert edited(train, lambda d: d.pop())
    counting = train[1]["validation_per_category"]["counting"]
    assert not edited(train, lambda d: d[1]["validation_per_category"].update(counting=counting + 2 / 16))
    assert edited(train, lambda d: d[1]["validation_per_category"].update(counting=counting + 3 / 16))
    assert not edited(train, lambda d: d[0].update(proxy_heldout=d[0]["proxy_heldout"] + 1 / 64))  # a held-out mean
    assert not edited(run, lambda d: d["requests"][0].__setitem__(7, "0" * 32))
    assert edited(run, lambda d: d["requests"][0].__setitem__(8, 0.25))  # the request's reward
    assert edited(run, lambda d: d["requests"][0].__setitem__(3, "a red circle"))  # the request's prompt
    assert edited(run, lambda d: d["syncs"][1].__setitem__(4, d["syncs"][1][4] * 2))  # a patch twice the size


def test_spotlight_train_and_the_pipeline_are_one_driver_with_one_numbering(smoke_train, smoke_run):
    """Iteration k of `spotlight train` is iteration k of the pipeline: the same update of weights v(k) into
    v(k+1) (reward, loss, gradient norm) and the same held-out score of v(k), to the digit, on this machine."""
    train = train_digest(smoke_train.stdout)
    run = ledger_digest(smoke_run.path("rel/run") / "ledger.duckdb")
    steps = {row[0]: row for row in run["train_steps"]}  # iteration, step, loss, kl, reward_mean, reward_std, ...
    assert [r["iteration"] for r in train if "reward_mean" in r] == sorted(steps) == [0, 1]
    for record in train:
        if "reward_mean" in record:
            _, _, loss, kl, reward_mean, reward_std, zero_std, _, grad_norm, lr = steps[record["iteration"]]
            assert (
                record["loss"],
                record["kl"],
                record["reward_mean"],
                record["reward_std"],
                record["zero_std_ratio"],
                record["grad_norm"],
                record["learning_rate"],
            ) == (loss, kl, reward_mean, reward_std, zero_std, grad_norm, lr)
    assert [(r["iteration"], r["validation_score"]) for r in train] == [
        (k, score) for k, _, score, _ in run["validation"]
    ]
