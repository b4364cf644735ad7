"""A CLIP-style text-image reward from a local folder: logit_scale * cos(text, image) (PickScore's score).

PickScore (CLIP-H fine-tuned on Pick-a-Pic) and any transformers `CLIPModel` folder work; HPS v2 ships
open_clip weights, which need converting to a transformers folder first. The folder is checked when the
spec is resolved (config, safetensors weights, tokenizer, image processor), before any image is scored;
the weights load on the first call, once per process, on the GPU when there is one.

Example:
    reward_fn = get_reward("clip:/models/PickScore_v1,processor=/models/CLIP-ViT-H-14")
    scores = reward_fn(images_NHW3, prompts)        # (N,) float64, ~20 for PickScore
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workers.task.reward_inputs import check_reward_batch

DTYPES = ("float32", "float16", "bfloat16")
_LOADED: dict[tuple, tuple] = {}
"""(model, processor, device, dtype) -> (model, tokenizer, image_processor, device): loaded once per process."""
_LOAD_LOCK = threading.Lock()


@dataclass(frozen=True)
class ClipRewardConfig:
    model_path: str
    """Folder of a transformers CLIPModel (config.json with model_type 'clip', model.safetensors)."""
    processor_path: str | None = None
    """Folder with the tokenizer and preprocessor_config.json; None = model_path. PickScore's is CLIP-ViT-H-14's."""
    device: str | None = None
    """torch device; None = cuda when available, else cpu."""
    batch_size: int = 32
    """Images (and prompts) per forward."""
    dtype: str = "float32"
    """Weights' dtype; float32 by default: ~100 x cos needs more than bf16's 3 digits to rank close samples."""

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")


def parse_clip_spec(arg: str) -> ClipRewardConfig:
    """`PATH[,processor=PATH][,device=cuda:1][,batch_size=N][,dtype=float16]` -> config (ValueError if malformed)."""
    path, *options = arg.split(",")
    fields: dict[str, object] = {}
    names = {"processor": "processor_path", "device": "device", "batch_size": "batch_size", "dtype": "dtype"}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key not in names or not value:
            raise ValueError(f"clip reward option {option!r}: use key=value with key one of {sorted(names)}")
        fields[names[key]] = value
    if "batch_size" in fields:
        if not str(fields["batch_size"]).isdigit():
            raise ValueError(f"clip reward batch_size must be an integer, got {fields['batch_size']!r}")
        fields["batch_size"] = int(fields["batch_size"])
    return ClipRewardConfig(model_path=path, **fields)


def check_clip_folders(config: ClipRewardConfig) -> None:
    """ValueError naming the folder and what it lacks, before any weights load."""
    model = Path(config.model_path)
    config_file = model / "config.json"
    if not config_file.is_file():
        raise ValueError(
            f"clip reward: {model} holds no CLIP model (no config.json); pass a CLIPModel folder "
            "saved with save_pretrained, e.g. a PickScore_v1 snapshot"
        )
    model_type = json.loads(config_file.read_text()).get("model_type")
    if model_type != "clip":
        raise ValueError(f"clip reward: {model} holds a {model_type!r} model (config.json), not a CLIP model ('clip')")
    if not (model / "model.safetensors").is_file() and not (model / "model.safetensors.index.json").is_file():
        raise ValueError(
            f"clip reward: {model} has no model.safetensors; spotlight loads safetensors weights "
            "only (a pytorch_model.bin is a pickle)"
        )
    processor = Path(config.processor_path or config.model_path)
    has_tokenizer = (processor / "tokenizer.json").is_file() or (processor / "vocab.json").is_file()
    if not (processor / "preprocessor_config.json").is_file() or not has_tokenizer:
        raise ValueError(
            f"clip reward: {processor} lacks a tokenizer or preprocessor_config.json; pass "
            "processor=PATH (PickScore uses laion/CLIP-ViT-H-14-laion2B-s32B-b79K's processor)"
        )


def _load(config: ClipRewardConfig) -> tuple:
    key = (config.model_path, config.processor_path, config.device, config.dtype)
    with _LOAD_LOCK:
        if key not in _LOADED:
            import torch

            # The PIL processor always: PickScore and CLIP were trained on PIL's resize, and the torchvision
            # backend (the default where torchvision is installed) rounds differently, machine to machine.
            from transformers import AutoTokenizer, CLIPImageProcessorPil, CLIPModel

            device = config.device or ("cuda" if torch.cuda.is_available() else "cpu")
            processor = config.processor_path or config.model_path
            model = CLIPModel.from_pretrained(
                config.model_path, local_files_only=True, use_safetensors=True, dtype=getattr(torch, config.dtype)
            )
            tokenizer = AutoTokenizer.from_pretrained(processor, local_files_only=True)
            image_processor = CLIPImageProcessorPil.from_pretrained(processor, local_files_only=True)
            _LOADED[key] = (model.eval().requires_grad_(False).to(device), tokenizer, image_processor, device)
        return _LOADED[key]


def _features(output):
    """transformers 5 returns a model output whose pooler_output is the projected embedding; 4.x a tensor."""
    import torch

    return output if isinstance(output, torch.Tensor) else output.pooler_output


class ClipReward:
    """logit_scale * cos(text embedding, image embedding) per (image, prompt); each prompt is encoded once per call."""

    def __init__(self, config: ClipRewardConfig):
        check_clip_folders(config)
        self.config = config

    def load(self) -> None:
        """Load the weights now (the first call would otherwise); `spotlight reward-serve` does before serving."""
        _load(self.config)

    def __call__(self, images_NHW3: np.ndarray, prompts: list[str]) -> np.ndarray:
        import torch

        check_reward_batch(images_NHW3, prompts)
        model, tokenizer, image_processor, device = _load(self.config)
        unique = sorted(set(prompts))
        size, max_len = self.config.batch_size, model.config.text_config.max_position_embeddings
        with torch.inference_mode():
            text = []
            for i in range(0, len(unique), size):
                tokens = tokenizer(
                    unique[i : i + size], padding=True, truncation=True, max_length=max_len, return_tensors="pt"
                ).to(device)
                text.append(
                    _features(
                        model.get_text_features(
                            input_ids=tokens["input_ids"], attention_mask=tokens.get("attention_mask")
                        )
                    ).float()
                )
            image = []
            for i in range(0, len(images_NHW3), size):
                pixels = image_processor(images=list(images_NHW3[i : i + size]), return_tensors="pt")["pixel_values"]
                image.append(_features(model.get_image_features(pixel_values=pixels.to(device, model.dtype))).float())
            text_PD = torch.nn.functional.normalize(torch.cat(text), dim=-1)  # fp32: cos is the score
            image_ND = torch.nn.functional.normalize(torch.cat(image), dim=-1)
            position = {p: i for i, p in enumerate(unique)}
            rows = torch.tensor([position[p] for p in prompts], device=text_PD.device)
            cos_N = (text_PD[rows] * image_ND).sum(-1)
            scores = model.logit_scale.float().exp() * cos_N
        return scores.double().cpu().numpy()


def clip_reward(arg: str) -> ClipReward:
    """The `clip:` / `pickscore:` spec's factory: checks the folders now, loads the weights on the first call."""
    return ClipReward(parse_clip_spec(arg))
