"""SP for the model families (workers/sp/model_sp.py): which degrees split a policy, and what padding the text costs.

Ulysses needs the degree to divide the attention heads, the image tokens and the text tokens. These run in one
process: the checks need no group, and the padding is compared on the single-process forward.
"""

from __future__ import annotations

import pytest
import torch

from workers.model.families.diffusers_policy import load_model_policy
from workers.sp.model_sp import sp_degrees, sp_view

PROMPT = "two red circles"


@pytest.fixture(scope="module")
def qwen(qwen4):
    return load_model_policy(qwen4, resolution=32, guidance=3.0)  # 4 heads, 16 image tokens


def test_qwen_image_splits_into_the_degrees_that_divide_its_heads_and_image_tokens(qwen):
    assert sp_degrees(qwen, 8, [PROMPT]) == [1, 2, 4]
    with pytest.raises(ValueError, match="SP degree 3 must divide the 4 attention heads"):
        sp_view(qwen, 3)
    with pytest.raises(ValueError, match="SP degree 2 must divide the 9 image tokens of qwen-image at resolution 24"):
        sp_view(qwen.at(resolution=24), 2)


def test_masked_text_is_padded_to_the_degree_and_moves_the_velocity_by_under_1e5(qwen):
    cond, _ = qwen.encode_prompts([PROMPT])
    padded, _ = sp_view(qwen, 2).encode_prompts([PROMPT])
    assert cond.uncond["encoder_hidden_states"].shape[1] % 2 == 1, "the fixture's negative prompt should need padding"
    assert padded.uncond["encoder_hidden_states"].shape[1] % 2 == 0
    assert not padded.uncond["encoder_hidden_states_mask"][:, -1].any()
    x, sigma = torch.randn(1, *qwen.latent_shape, generator=torch.Generator().manual_seed(0)), torch.tensor([0.7])
    with torch.no_grad():
        gap = (qwen.velocity(x, sigma, cond) - qwen.velocity(x, sigma, padded)).abs().max().item()
    assert gap < 1e-5


def test_a_degree_of_one_leaves_the_conditioning_untouched(qwen):
    cond, _ = qwen.encode_prompts([PROMPT])
    same, _ = sp_view(qwen, 1).encode_prompts([PROMPT])
    assert all(torch.equal(cond.uncond[k], same.uncond[k]) for k in cond.uncond)


def test_sd3_is_refused_above_degree_one_with_the_reason(tmp_path):
    from workers.model.families.tiny import build_tiny_pipeline

    sd3 = load_model_policy(build_tiny_pipeline("sd3", tmp_path / "sd3"), resolution=32)
    with pytest.raises(
        ValueError, match="SD3Transformer2DModel has no context-parallel plan .* serve it at SP degree 1"
    ):
        sp_view(sd3, 2)
    assert sp_degrees(sd3, 4, [PROMPT]) == [1]


def test_flux_text_without_a_mask_must_divide_by_the_degree(tmp_path):
    from workers.model.families.tiny import build_tiny_pipeline

    path = build_tiny_pipeline("flux", tmp_path / "flux")
    odd = load_model_policy(path, resolution=32, max_sequence_length=7)
    with pytest.raises(ValueError, match="SP degree 2 must divide the 7 text tokens of flux, which has no text mask"):
        sp_view(odd, 2).encode_prompts([PROMPT])
    assert sp_degrees(odd, 2, [PROMPT]) == [1]
    assert sp_degrees(load_model_policy(path, resolution=32, max_sequence_length=8), 2, [PROMPT]) == [1, 2]


def test_a_folder_is_checked_for_a_degree_from_its_config_files_as_the_node_would_probe_it(qwen4, tmp_path):
    """What `spotlight launch --sp-degree` can know before any node starts: plan, heads, image tokens."""
    from workers.model.families.tiny import build_tiny_pipeline
    from workers.sp.model_sp import check_folder_degree

    for degree in (1, 2, 4):
        check_folder_degree(str(qwen4), degree, {"resolution": 32})
    with pytest.raises(ValueError, match=r"SP degree 3 must divide the 4 attention heads .* choose one of \[1, 2, 4\]"):
        check_folder_degree(str(qwen4), 3, {"resolution": 32})
    with pytest.raises(ValueError, match="SP degree 2 must divide the 9 image tokens of qwen-image at resolution 24"):
        check_folder_degree(str(qwen4), 2, {"resolution": 24})
    sd3 = build_tiny_pipeline("sd3", tmp_path / "sd3")
    check_folder_degree(str(sd3), 1)
    with pytest.raises(ValueError, match="SD3Transformer2DModel, the transformer of .* has no context-parallel plan"):
        check_folder_degree(str(sd3), 2)
