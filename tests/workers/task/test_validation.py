"""Which reward validates a run, on which held-out prompts: the defaults, a prompts file, and what is refused."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from workers.algo.sampler import SamplerConfig
from workers.task.evaluate import evaluate_reward
from workers.task.prompts import parse_prompt, split_prompts
from workers.task.rewards import get_reward
from workers.task.validation import (
    DETECTOR_REWARD,
    ValidationConfig,
    read_prompts_file,
    resolve_validation,
    validation_from_options,
)

ZSCORED = "multi:minigeneval=1,jpeg_compressibility=0.01,normalize=zscore"


def test_the_pixel_policy_keeps_minigenevals_detector_and_a_model_run_validates_with_its_reward():
    pixel = resolve_validation(None, "minigeneval", model=False)
    assert (pixel.reward, pixel.detector, pixel.prompts) == (DETECTOR_REWARD, True, tuple(split_prompts()["heldout"]))
    model = resolve_validation(None, "jpeg_compressibility", model=True)
    assert (model.reward, model.detector, model.prompts) == ("jpeg_compressibility", False, pixel.prompts)
    named = resolve_validation(ValidationConfig(reward="minigeneval"), "jpeg_compressibility", model=True)
    assert (named.reward, named.detector) == ("minigeneval", False)


def test_max_prompts_keeps_that_many_held_out_prompts_spread_over_every_category(tmp_path):
    heldout = tuple(split_prompts()["heldout"])
    kept = validation_from_options(None, None, "minigeneval", model=False, max_prompts=16).prompts
    assert kept is not None and len(kept) == 16 and set(kept) < set(heldout)
    assert list(kept) == sorted(kept, key=heldout.index)  # in the held-out order
    by_category = Counter(parse_prompt(p).category for p in kept)
    assert by_category == {c: 4 for c in {parse_prompt(p).category for p in heldout}}  # 4 of each 16
    path = tmp_path / "heldout.txt"
    path.write_text("a photo of a corgi\nan oil painting of a harbour\n")
    few = validation_from_options("jpeg_compressibility", path, "minigeneval", model=True, max_prompts=16)
    assert few.prompts == read_prompts_file(path)  # fewer than asked: all of them
    with pytest.raises(ValueError, match="validation_max_prompts must be >= 1"):
        validation_from_options(None, None, "minigeneval", model=False, max_prompts=0)


def test_a_prompts_file_holds_one_prompt_a_line_with_comments_and_blank_lines(tmp_path):
    path = tmp_path / "heldout.txt"
    path.write_text("# PickScore held-out\na photo of a corgi in the snow\n\n  an oil painting of a harbour  \n")
    assert read_prompts_file(path) == ("a photo of a corgi in the snow", "an oil painting of a harbour")
    config = validation_from_options("jpeg_compressibility", path, "minigeneval", model=True)
    assert config.prompts == read_prompts_file(path) and config.reward == "jpeg_compressibility"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "holds no prompt"),
        ("# only a comment\n", "holds no prompt"),
        ("a red circle\na red circle\n", "prompt 2 repeats prompt 1"),
    ],
)
def test_a_prompts_file_that_cannot_be_used_is_refused_with_the_reason(tmp_path, text, message):
    path = tmp_path / "heldout.txt"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_prompts_file(path)
    with pytest.raises(ValueError, match="no such file"):
        read_prompts_file(tmp_path / "missing.txt")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    with pytest.raises(ValueError, match="UTF-8"):
        read_prompts_file(tmp_path / "latin1.txt")


def test_prompts_the_pixel_policy_or_the_detector_cannot_read_are_refused_before_any_compute(tmp_path):
    path = tmp_path / "heldout.txt"
    path.write_text("a red circle\na photo of a corgi\n")
    with pytest.raises(ValueError, match=r"prompt 2 .*corgi.* not a MiniGenEval prompt.*the pixel policy"):
        validation_from_options(None, path, "minigeneval", model=False)
    with pytest.raises(ValueError, match="MiniGenEval's detector"):
        validation_from_options(DETECTOR_REWARD, path, "jpeg_compressibility", model=True)
    validation_from_options("jpeg_compressibility", path, "jpeg_compressibility", model=True)  # any text for a model


def test_a_zscored_reward_cannot_validate_and_the_message_says_what_to_pass():
    with pytest.raises(ValueError, match="--validation-reward .* normalize=zscore: z-scored totals average to 0"):
        ValidationConfig(reward=ZSCORED)
    with pytest.raises(ValueError, match="the run's reward .*pass --validation-reward"):
        resolve_validation(None, ZSCORED, model=True)
    resolve_validation(ValidationConfig(reward="jpeg_compressibility"), ZSCORED, model=True)
    with pytest.raises(ValueError, match="unknown reward"):
        ValidationConfig(reward="pickscroe")


def test_a_reward_validation_is_the_rewards_mean_over_prompts_and_fixed_seeds(tiny_policy):
    prompts = ["a red circle", "two blue squares", "a green triangle on the left"]
    sampler = SamplerConfig(num_steps=3, noise_level=0.7, sde_window=(0, 2), forward_dtype="fp32")
    result = evaluate_reward(tiny_policy, prompts, "jpeg_compressibility", 2, sampler, keep_images=True)
    assert result.prompts == [p for p in prompts for _ in range(2)] and len(result.scores) == 6
    np.testing.assert_allclose(result.scores, get_reward("jpeg_compressibility")(result.images, result.prompts))
    assert result.score == pytest.approx(np.mean(result.scores)) and result.partial is None
    assert sorted(result.per_category) == sorted({parse_prompt(p).category for p in prompts})  # MiniGenEval prompts
    again = evaluate_reward(tiny_policy, prompts, "jpeg_compressibility", 2, sampler)
    assert again.scores == result.scores  # fixed seeds and the ODE (the SDE settings are dropped)
    multi = evaluate_reward(tiny_policy, prompts, "multi:jpeg_compressibility=1,minigeneval=0", 2, sampler)
    assert sorted(multi.per_criterion) == ["reward/jpeg_compressibility", "reward/minigeneval"]
    assert multi.per_criterion["reward/jpeg_compressibility"] == pytest.approx(result.score) == multi.score
