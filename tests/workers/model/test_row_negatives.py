"""A prompts file row's own negative prompt reaches true CFG: a diffusers policy guides that prompt away from it, and
every other prompt away from the run's negative prompt (tiny SD3.5 pipeline, real diffusers models)."""

from __future__ import annotations

import pytest
import torch

from workers.model.families.diffusers_policy import load_model_policy
from workers.task.prompt_row import fields_negative, set_row_negatives


@pytest.fixture(scope="module")
def sd3(tmp_path_factory):
    from workers.model.families.tiny import build_tiny_pipeline

    return build_tiny_pipeline("sd3", tmp_path_factory.mktemp("pipelines") / "sd3")


def _velocity(policy, prompt: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, *policy.latent_shape, generator=gen)
    with torch.no_grad():
        return policy.velocity(x, torch.tensor([0.7]), *policy.encode_prompts([prompt]))


def test_a_rows_negative_prompt_guides_its_prompt_and_no_other(sd3):
    run_default = load_model_policy(sd3, resolution=32, guidance=4.5)
    with_row = load_model_policy(sd3, resolution=32, guidance=4.5)
    set_row_negatives(with_row, fields_negative("a cat", {"negative_prompt": "blurry, low quality"}))
    as_if_run_wide = load_model_policy(sd3, resolution=32, guidance=4.5, negative_prompt="blurry, low quality")
    torch.testing.assert_close(_velocity(with_row, "a cat"), _velocity(as_if_run_wide, "a cat"))
    torch.testing.assert_close(_velocity(with_row, "a dog"), _velocity(run_default, "a dog"))
    assert not torch.allclose(_velocity(with_row, "a cat"), _velocity(run_default, "a cat"))
    view = with_row.at(guidance=2.0)  # validation's evaluation guidance keeps the rows' negative prompts
    assert view.row_negatives == {"a cat": "blurry, low quality"}
    assert fields_negative("a cat", {"reference": "x"}) == {} and fields_negative("a cat", None) == {}
