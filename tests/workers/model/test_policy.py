import json

import pytest
import torch

from workers.model.tiny_policy import PolicyConfig, load_policy, patchify, save_policy, unpatchify


def test_patchify_packs_2x2_pixel_patches_and_inverts():
    x = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    tokens = patchify(x, 2)
    assert tokens.shape == (2, 4, 12)
    assert tokens[0, 0].tolist()[:4] == [0.0, 1.0, 4.0, 5.0]  # channel 0 of the top-left 2x2 patch
    assert torch.equal(unpatchify(tokens, 2, 4), x)


def test_saved_policy_loads_through_from_pretrained_with_identical_outputs(tiny_policy, tmp_path):
    save_policy(tiny_policy, tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "transformer" / "config.json").is_file()
    loaded = load_policy(tmp_path / "ckpt").eval()
    x = torch.randn(2, 3, 16, 16)
    sigma = torch.tensor([0.3, 0.8])
    with torch.no_grad():
        a = tiny_policy.velocity(x, sigma, *tiny_policy.encode_prompts(["a red circle", "two blue squares"]))
        b = loaded.velocity(x, sigma, *loaded.encode_prompts(["a red circle", "two blue squares"]))
    assert torch.equal(a, b)


def test_shipped_base_loads_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    policy = load_policy()
    assert policy.config.image_size == 32
    assert 2e6 < sum(p.numel() for p in policy.parameters()) < 4e6


def test_loading_a_folder_that_is_not_a_policy_says_how_to_make_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="spotlight pretrain"):
        load_policy(tmp_path)


def test_a_checkpoint_with_another_vocabulary_is_refused(tiny_policy, tmp_path):
    save_policy(tiny_policy, tmp_path)
    meta = json.loads((tmp_path / "policy.json").read_text())
    meta["vocab"] = meta["vocab"][:-1]
    (tmp_path / "policy.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="vocabulary"):
        load_policy(tmp_path)


def test_bad_policy_config_names_the_field():
    with pytest.raises(ValueError, match="rope_axes"):
        PolicyConfig(rope_axes=(8, 8, 8))
    with pytest.raises(ValueError, match="image_size"):
        PolicyConfig(image_size=33)
