"""Tiny random-init pipelines of each family, built from configs with no download, saved with save_pretrained.

They have the real pipelines' classes and folder layout (model_index.json, transformer/, vae/, text
encoder(s) and tokenizer(s), scheduler/), so `spotlight train --model DIR` loads them through exactly
the path a user's checkpoint takes. The tokenizers are made locally with the `tokenizers` library: a
word-level vocabulary of MiniGenEval's words plus the families' template words, wrapped as a
`PreTrainedTokenizerFast`. Each scheduler config is the real model's published one (`PUBLISHED_SCHEDULERS`), and
each VAE carries the real model's latent normalisation (Qwen-Image's per-channel latents_mean/std, SD3.5's and
FLUX.1's scaling and shift factors), so a normalisation or schedule bug shows on them. `widths="real"` on
Qwen-Image keeps the real model's transformer widths (3072 wide, 24 heads of 128) with fewer layers: the GPU
check's model.

Example:
    path = build_tiny_pipeline("qwen-image", "/tmp/tiny-qwen")       # about 2 MB
    policy = load_model_policy(path, resolution=32, lora_rank=4)
"""

from __future__ import annotations

from pathlib import Path

import torch

from workers.model.families.family import quiet_loading
from workers.task.prompts import VOCAB

PUBLISHED_SCHEDULERS = {
    "qwen-image": {
        "base_image_seq_len": 256,
        "base_shift": 0.5,
        "invert_sigmas": False,
        "max_image_seq_len": 8192,
        "max_shift": 0.9,
        "num_train_timesteps": 1000,
        "shift": 1.0,
        "shift_terminal": 0.02,
        "stochastic_sampling": False,
        "time_shift_type": "exponential",
        "use_beta_sigmas": False,
        "use_dynamic_shifting": True,
        "use_exponential_sigmas": False,
        "use_karras_sigmas": False,
    },
    "sd3": {"num_train_timesteps": 1000, "shift": 3.0},
    "flux": {
        "base_image_seq_len": 256,
        "base_shift": 0.5,
        "max_image_seq_len": 4096,
        "max_shift": 1.15,
        "num_train_timesteps": 1000,
        "shift": 3.0,
        "use_dynamic_shifting": True,
    },
}
"""scheduler/scheduler_config.json of Qwen/Qwen-Image, stabilityai/stable-diffusion-3.5-medium and
black-forest-labs/FLUX.1-dev (FlowMatchEulerDiscreteScheduler; the `_class_name` and `_diffusers_version` keys
left out)."""
QWEN_IMAGE_LATENTS_MEAN = (
    -0.7571,
    -0.7089,
    -0.9113,
    0.1075,
    -0.1745,
    0.9653,
    -0.1517,
    1.5508,
    0.4134,
    -0.0715,
    0.5517,
    -0.3632,
    -0.1922,
    -0.9497,
    0.2503,
    -0.2921,
)
QWEN_IMAGE_LATENTS_STD = (
    2.8184,
    1.4541,
    2.3275,
    2.6558,
    1.2196,
    1.7708,
    2.6052,
    2.0743,
    3.2687,
    2.1526,
    2.8652,
    1.5579,
    1.6382,
    1.1253,
    2.8251,
    1.9160,
)
"""Qwen-Image's VAE (vae/config.json): the per-channel statistics its latents are normalised by."""
VAE_FACTORS = {
    "sd3": {"scaling_factor": 1.5305, "shift_factor": 0.0609},
    "flux": {"scaling_factor": 0.3611, "shift_factor": 0.1159},
}
"""SD3.5's and FLUX.1's AutoencoderKL (vae/config.json): latents = (z - shift) * scaling."""

TEMPLATE_WORDS = (
    "system user assistant describe the image by detailing color shape size texture quantity text "
    "spatial relationships of objects and background"
).split()
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>", "<s>", "</s>", "<pad>")


def tiny_tokenizer(max_length: int, bos: str | None = None, eos: str | None = None, pad: str = "<|endoftext|>"):
    """A word-level tokenizer: newlines and punctuation are tokens of their own (so Qwen-Image's template prefix
    is 34 tokens, the number its pipeline drops), unknown words map to <unk>."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for token in (*SPECIALS, "\n", ",", ":", ".", *TEMPLATE_WORDS, *VOCAB):
        for form in (token, token.capitalize()):
            vocab.setdefault(form, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.Split(" ", "removed"), pre_tokenizers.Punctuation()]
    )
    if bos or eos:
        single = " ".join(t for t in (bos, "$A", eos) if t)
        tok.post_processor = processors.TemplateProcessing(
            single=single, special_tokens=[(t, vocab[t]) for t in (bos, eos) if t]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token=pad,
        bos_token=bos,
        eos_token=eos or "<|im_end|>",
        model_max_length=max_length,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )


def vocab_size() -> int:
    return len(tiny_tokenizer(8))


def _qwen_image(widths: str, num_layers: int = 2, num_heads: int = 3):
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    transformer, vae = _qwen_image_transformer_and_vae(widths, num_layers, num_heads)
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**PUBLISHED_SCHEDULERS["qwen-image"]),
        vae=vae,
        text_encoder=_qwen_text_encoder(),
        tokenizer=tiny_tokenizer(1058),
        transformer=transformer,
    )


def _qwen_text_encoder():
    """A two-layer Qwen2.5-VL of width 16 over the tiny tokenizer's vocabulary."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    n = vocab_size() + 8
    text_config = {
        "hidden_size": 16,
        "intermediate_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "rope_theta": 1000000.0,
        "vocab_size": n,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
    }
    config = Qwen2_5_VLConfig(
        text_config=text_config,
        hidden_size=16,
        vocab_size=n,
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        vision_start_token_id=n - 5,
        vision_end_token_id=n - 4,
        vision_token_id=n - 3,
        image_token_id=n - 2,
        video_token_id=n - 1,
        bos_token_id=1,
        eos_token_id=2,
    )
    return Qwen2_5_VLForConditionalGeneration(config)


def _qwen_image_transformer_and_vae(widths: str, num_layers: int, num_heads: int):
    """Qwen-Image's transformer and VAE: at its real widths (3072 = 24 x 128; `num_layers` of its 60 blocks) with
    the real VAE's shape, or tiny ones (widths "tiny": 2 blocks, `num_heads` heads of 16)."""
    from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel

    if widths == "real":
        transformer = QwenImageTransformer2DModel(
            patch_size=2,
            in_channels=64,
            out_channels=16,
            num_layers=num_layers,
            attention_head_dim=128,
            num_attention_heads=24,
            joint_attention_dim=16,
            axes_dims_rope=(16, 56, 56),
        )
        vae = AutoencoderKLQwenImage(
            z_dim=16, latents_mean=list(QWEN_IMAGE_LATENTS_MEAN), latents_std=list(QWEN_IMAGE_LATENTS_STD)
        )
        return transformer, vae
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=16,
        out_channels=4,
        num_layers=2,
        attention_head_dim=16,
        num_attention_heads=num_heads,
        joint_attention_dim=16,
        axes_dims_rope=(8, 4, 4),
    )
    vae = AutoencoderKLQwenImage(
        base_dim=24,
        z_dim=4,
        dim_mult=[1, 2, 4],
        num_res_blocks=1,
        temperal_downsample=[False, True],
        latents_mean=list(QWEN_IMAGE_LATENTS_MEAN[:4]),
        latents_std=list(QWEN_IMAGE_LATENTS_STD[:4]),
    )
    return transformer, vae


def _clip_pair(projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    tok = tiny_tokenizer(77, bos="<s>", eos="</s>", pad="<pad>")
    config = CLIPTextConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        hidden_size=32,
        intermediate_size=37,
        num_attention_heads=4,
        num_hidden_layers=2,
        vocab_size=len(tok),
        projection_dim=32,
        max_position_embeddings=77,
    )
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config), tok


def _t5(d_model: int):
    from transformers import T5Config, T5EncoderModel

    tok = tiny_tokenizer(512, eos="</s>", pad="<pad>")
    config = T5Config(
        vocab_size=len(tok),
        d_model=d_model,
        d_kv=8,
        d_ff=37,
        num_layers=2,
        num_heads=4,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        decoder_start_token_id=0,
    )
    return T5EncoderModel(config), tok


def _kl_vae(latent_channels: int, family: str):
    from diffusers import AutoencoderKL

    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        block_out_channels=(8, 8),
        layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        latent_channels=latent_channels,
        norm_num_groups=4,
        use_quant_conv=False,
        use_post_quant_conv=False,
        sample_size=32,
        **VAE_FACTORS[family],
    )


def _sd3():
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    (clip_l, tok_l), (clip_g, tok_g) = _clip_pair(True), _clip_pair(True)
    t5, tok_t5 = _t5(64)
    transformer = SD3Transformer2DModel(
        sample_size=16,
        patch_size=2,
        in_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=4,
        caption_projection_dim=32,
        joint_attention_dim=64,
        pooled_projection_dim=64,
        out_channels=4,
    )
    return StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**PUBLISHED_SCHEDULERS["sd3"]),
        vae=_kl_vae(4, "sd3"),
        text_encoder=clip_l,
        tokenizer=tok_l,
        text_encoder_2=clip_g,
        tokenizer_2=tok_g,
        text_encoder_3=t5,
        tokenizer_3=tok_t5,
        transformer=transformer,
    )


def _flux():
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel

    clip, tok = _clip_pair(False)
    t5, tok_t5 = _t5(32)
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,
        out_channels=16,
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        axes_dims_rope=(4, 4, 8),
        guidance_embeds=True,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(**PUBLISHED_SCHEDULERS["flux"])
    return FluxPipeline(
        scheduler=scheduler,
        vae=_kl_vae(4, "flux"),
        text_encoder=clip,
        tokenizer=tok,
        text_encoder_2=t5,
        tokenizer_2=tok_t5,
        transformer=transformer,
    )


BUILDERS = {"qwen-image": _qwen_image, "sd3": _sd3, "flux": _flux}


def build_tiny_pipeline(
    family: str, out: str | Path, seed: int = 0, widths: str = "tiny", num_layers: int = 2, num_heads: int = 3
) -> Path:
    """Build a random-init pipeline of `family` (deterministic in seed) and save it to `out`; returns the path.
    num_layers: transformer blocks of the real-widths Qwen-Image (the GPU check's per-layer memory).
    num_heads: attention heads of the tiny Qwen-Image (of 16 channels each; an SP group of 2 needs an even count)."""
    if family not in BUILDERS:
        raise ValueError(f"unknown family {family!r}; tiny pipelines exist for {sorted(BUILDERS)}")
    if widths not in ("tiny", "real") or (widths == "real" and family != "qwen-image"):
        raise ValueError("widths='real' exists for qwen-image only; use widths='tiny'")
    if num_heads != 3 and (family != "qwen-image" or widths != "tiny"):
        raise ValueError("num_heads applies to the tiny-widths qwen-image only")

    quiet_loading()
    torch.manual_seed(seed)
    pipe = BUILDERS[family](widths, num_layers, num_heads) if family == "qwen-image" else BUILDERS[family]()
    out = Path(out)
    pipe.save_pretrained(out, safe_serialization=True)
    return out
