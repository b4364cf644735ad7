"""A pipeline folder of config.json files only: the published Qwen-Image's architecture with no weights, for the
memory plan (`spotlight config --model DIR --memory GPU_GB` builds it on the meta device) where the 57 GB of weights
are not on this machine.

The transformer and the VAE are diffusers' `QwenImageTransformer2DModel` and `AutoencoderKLQwenImage` at their
defaults, which are Qwen/Qwen-Image's published configs (60 blocks of 24 heads of 128, joint_attention_dim 3584);
the text encoder is Qwen2.5-VL-7B-Instruct's published config.json values. Nothing here can sample: it has no
weights and no tokenizer.

Example:
    folder = write_qwen_image_configs("/tmp/qwen-image-configs")
    model_sizes(folder, lora_rank=64).transformer_params        # about 20.4e9
"""

from __future__ import annotations

import json
from pathlib import Path

QWEN25_VL_7B_TEXT = {
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "max_position_embeddings": 128000,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "rope_scaling": {"mrope_section": [16, 24, 24], "rope_type": "default", "type": "default"},
}
"""Qwen2.5-VL-7B-Instruct's language model (its config.json)."""
QWEN25_VL_7B_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "intermediate_size": 3420,
    "num_heads": 16,
    "out_hidden_size": 3584,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "in_chans": 3,
}
"""Qwen2.5-VL-7B-Instruct's vision tower (its config.json's vision_config)."""


def write_qwen_image_configs(out: str | Path, num_layers: int = 60) -> Path:
    """Write Qwen-Image's model_index.json and each part's config.json (no weights) to `out`; returns it."""
    import diffusers
    from accelerate import init_empty_weights
    from transformers import Qwen2_5_VLConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with init_empty_weights():
        diffusers.QwenImageTransformer2DModel(num_layers=num_layers).save_config(out / "transformer")
        diffusers.AutoencoderKLQwenImage().save_config(out / "vae")
    config = Qwen2_5_VLConfig(text_config=QWEN25_VL_7B_TEXT, vision_config=QWEN25_VL_7B_VISION, **QWEN25_VL_7B_TEXT)
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    config.save_pretrained(out / "text_encoder")
    diffusers.FlowMatchEulerDiscreteScheduler().save_config(out / "scheduler")
    index = {
        "_class_name": "QwenImagePipeline",
        "_diffusers_version": diffusers.__version__,
        "transformer": ["diffusers", "QwenImageTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLQwenImage"],
        "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    }
    (out / "model_index.json").write_text(json.dumps(index, indent=2))
    return out
