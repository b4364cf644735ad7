"""`spotlight pretrain`'s output is a policy a user can use: it loads (diffusers' from_pretrained under
`load_policy`) to the very weights the pretraining made, samples, and `spotlight train --checkpoint` starts from it."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from pipelines.cli import app

STEPS, BATCH, SEED = 2, 4, 0


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """A few pretraining steps from the shipped base, through the command; (folder, its --json record)."""
    from workers.model.tiny_policy import SHIPPED_BASE

    out = tmp_path_factory.mktemp("pretrain") / "base"
    threads = torch.get_num_threads()
    try:
        done = CliRunner().invoke(
            app,
            [
                "pretrain",
                "--out",
                str(out),
                "--init",
                str(SHIPPED_BASE),
                "--steps",
                str(STEPS),
                "--batch-size",
                str(BATCH),
                "--seed",
                str(SEED),
                "--json",
                "--save-every",  # saves at step 1: the replay below shows saving leaves the training unchanged
                "1",
            ],
        )
    finally:
        torch.set_num_threads(threads)
    assert done.exit_code == 0, done.output
    assert f"step 1/{STEPS}: saved {out}" in done.stderr and f"step {STEPS}/{STEPS}  loss" in done.stderr
    assert not out.with_name("base.saving").exists() and not out.with_name("base.old").exists()
    return out, json.loads(done.stdout.strip().splitlines()[-1])


def test_pretrain_output_loads_to_the_weights_it_trained_and_samples_like_them(pretrained):
    from workers.model.pretrain import PretrainConfig, pretrain
    from workers.model.tiny_policy import SHIPPED_BASE, load_policy
    from workers.task.evaluate import evaluate

    out, record = pretrained
    assert (record["steps"], record["seed"], record["init"]) == (STEPS, SEED, str(SHIPPED_BASE))
    assert 0 <= record["heldout_score"] <= 1 and set(record["per_category"]) == {
        "counting",
        "color_binding",
        "counting_binding",
        "position",
    }
    loaded = load_policy(out)
    # The same steps replayed here (pretraining is seeded) give the weights the folder holds, bit for bit.
    replayed = load_policy(SHIPPED_BASE)
    for _ in pretrain(replayed, PretrainConfig(steps=STEPS, batch_size=BATCH, seed=SEED)):
        pass
    base = load_policy(SHIPPED_BASE).state_dict()
    state, expected = loaded.state_dict(), replayed.state_dict()
    assert state.keys() == expected.keys()
    assert all(torch.equal(state[k], expected[k]) for k in state)
    assert any(not torch.equal(state[k], base[k]) for k in state)  # pretraining moved the base
    # Sampling from the loaded policy: real images, the ones the trained policy draws for the same prompts and seeds.
    prompts = ["three red circles", "two purple squares"]
    got = evaluate(loaded, prompts, seeds_per_prompt=1, num_steps=4, keep_images=True)
    want = evaluate(replayed, prompts, seeds_per_prompt=1, num_steps=4, keep_images=True)
    assert got.images.shape == (2, loaded.config.image_size, loaded.config.image_size, 3)
    assert got.images.std() > 0 and (got.images == want.images).all() and got.scores == want.scores


@pytest.mark.slow
def test_train_from_the_pretrain_output_starts_from_its_weights(pretrained, tmp_path):
    from resources.ledger.db import query_ledger
    from workers.coordinator.sync import published_form
    from workers.model.tiny_policy import load_policy
    from workers.pulse import weights_hash

    out, _ = pretrained
    prompts = tmp_path / "heldout.txt"
    prompts.write_text("three red circles\n")
    run = tmp_path / "run"
    threads = torch.get_num_threads()
    try:
        done = CliRunner().invoke(
            app,
            [
                "train",
                "--checkpoint",
                str(out),
                "--preset",
                "cpu_smoke",
                "--iterations",
                "1",
                "--validation-prompts",
                str(prompts),
                "--out",
                str(run),
                "--json",
            ],
        )
    finally:
        torch.set_num_threads(threads)
    assert done.exit_code == 0, done.output
    # Version 0, what the run synced to its samplers and trained from, is the pretrained policy's BF16 weights.
    (synced,) = query_ledger(run / "ledger.duckdb", "SELECT weights_hash FROM syncs WHERE version = 0").rows[0]
    assert synced == weights_hash(published_form(load_policy(out))[1])
    assert synced != weights_hash(published_form(load_policy())[1])  # not the shipped base it was pretrained from


def test_save_every_leaves_a_usable_base_mid_way_and_does_not_change_the_training(tmp_path):
    """`--save-every` (the command's, in the fixture above): a stopped pretraining leaves a base. The mid-way saves
    hold the EMA weights of their step, and saving does not perturb the run: it ends bit for bit where a run
    without saves ends."""
    from workers.model.pretrain import PretrainConfig, pretrain
    from workers.model.tiny_policy import SHIPPED_BASE, load_policy, save_policy

    config = PretrainConfig(steps=3, batch_size=2, seed=1)
    saved: dict[int, dict] = {}

    def save(step: int) -> None:
        save_policy(policy, tmp_path / f"at{step}")
        saved[step] = {k: v.clone() for k, v in policy.state_dict().items()}

    policy = load_policy(SHIPPED_BASE)
    losses = [loss for _, loss in pretrain(policy, config, save, save_every=1)]
    plain = load_policy(SHIPPED_BASE)
    assert [loss for _, loss in pretrain(plain, config)] == losses
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in policy.state_dict().items())
    assert sorted(saved) == [1, 2]  # the end is saved by the caller, as before
    base = load_policy(SHIPPED_BASE).state_dict()
    for step, state in saved.items():
        loaded = load_policy(tmp_path / f"at{step}").state_dict()
        assert all(torch.equal(loaded[k], state[k]) for k in state)
        assert any(not torch.equal(state[k], base[k]) for k in state)  # the EMA has moved off the base
    # What step 1 saved is the EMA (0.995) of the base and step 1's training weights, not the training weights.
    stepped = load_policy(SHIPPED_BASE)
    next(pretrain(stepped, config))
    trained = stepped.state_dict()
    assert any(not torch.equal(saved[1][k], trained[k]) for k in trained)
    for k, w in trained.items():
        torch.testing.assert_close(saved[1][k], torch.lerp(base[k], w, 1 - config.ema_decay), rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="save_every"):
        next(pretrain(load_policy(SHIPPED_BASE), config, None, save_every=2))
