"""The clip: reward on a tiny random-init CLIPModel saved to a folder, with a tokenizer made locally (no download)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from workers.task.rewards import get_reward

WORDS = "a an the red green blue yellow circle square triangle on left right top bottom of and two three".split()


def _tokenizer(max_length: int):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<unk>", "<|startoftext|>", "<|endoftext|>", *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", 2), ("<|endoftext|>", 3)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<|startoftext|>",
        eos_token="<|endoftext|>",
        model_max_length=max_length,
    )


def save_tiny_clip(folder: Path) -> Path:
    """A ~100k-parameter CLIPModel (32x32 images in 8x8 patches) with its tokenizer and image processor."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel

    torch.manual_seed(0)
    text = {
        "vocab_size": len(WORDS) + 4,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "max_position_embeddings": 16,
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 3,
    }
    vision = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "image_size": 32,
        "patch_size": 8,
    }
    CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16)).save_pretrained(folder)
    _tokenizer(16).save_pretrained(folder)
    CLIPImageProcessorPil(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def clip_dir(tmp_path_factory) -> Path:
    return save_tiny_clip(tmp_path_factory.mktemp("tiny_clip"))


def _images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 40, 48, 3), dtype=np.uint8)


def test_clip_reward_is_logit_scale_times_the_cosine_of_clip_embeddings(clip_dir):
    import torch
    from transformers import CLIPImageProcessorPil, CLIPModel, CLIPProcessor

    images, prompts = _images(3), ["a red circle", "two blue squares on the left", "a red circle"]
    scores = get_reward(f"clip:{clip_dir}")(images, prompts)
    model = CLIPModel.from_pretrained(clip_dir).eval()
    processor = CLIPProcessor(image_processor=CLIPImageProcessorPil.from_pretrained(clip_dir), tokenizer=_tokenizer(16))
    with torch.no_grad():
        out = model(**processor(text=prompts, images=list(images), return_tensors="pt", padding=True))
    np.testing.assert_allclose(scores, out.logits_per_image.diagonal().numpy(), rtol=1e-5, atol=1e-5)
    assert scores.dtype == np.float64 and scores.shape == (3,)


def test_clip_score_is_deterministic_batch_invariant_and_depends_on_the_prompt(clip_dir):
    images = _images(5)
    prompts = ["a red circle"] * 5
    whole = get_reward(f"clip:{clip_dir}")(images, prompts)
    in_pairs = get_reward(f"clip:{clip_dir},batch_size=2")(images, prompts)
    np.testing.assert_array_equal(whole, get_reward(f"clip:{clip_dir}")(images, prompts))
    np.testing.assert_allclose(in_pairs, whole, rtol=1e-5, atol=1e-5)
    other = get_reward(f"pickscore:{clip_dir}")(images, ["three green triangles on the top"] * 5)
    assert np.abs(other - whole).min() > 1e-4
    assert np.unique(np.round(whole, 6)).size == 5  # different images, different scores


def test_a_folder_without_a_clip_model_fails_when_the_spec_is_resolved(tmp_path, clip_dir):
    with pytest.raises(ValueError, match="holds no CLIP model"):
        get_reward(f"clip:{tmp_path}")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5"}))
    with pytest.raises(ValueError, match="'t5' model"):
        get_reward(f"clip:{tmp_path}")
    bare = tmp_path / "weights_only"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((clip_dir / name).read_bytes())
    with pytest.raises(ValueError, match="processor=PATH"):
        get_reward(f"clip:{bare}")
    assert get_reward(f"clip:{bare},processor={clip_dir}")(_images(1), ["a red circle"]).shape == (1,)


def test_malformed_clip_options_and_inputs_fail_with_a_message(clip_dir):
    with pytest.raises(ValueError, match="key one of"):
        get_reward(f"clip:{clip_dir},colour=red")
    with pytest.raises(ValueError, match="batch_size must be"):
        get_reward(f"clip:{clip_dir},batch_size=0")
    with pytest.raises(ValueError, match="dtype must be"):
        get_reward(f"clip:{clip_dir},dtype=int8")
    with pytest.raises(ValueError, match="uint8 images"):
        get_reward(f"clip:{clip_dir}")(_images(2).astype(np.float32), ["a", "b"])
    with pytest.raises(ValueError, match="2 images need 2 prompt"):
        get_reward(f"clip:{clip_dir}")(_images(2), ["a red circle"])
