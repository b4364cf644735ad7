"""The policy: diffusers' QwenImageTransformer2DModel in pixel space plus a small text encoder.

Images are RGB in [-1, 1]; 2x2 pixel patches become tokens of 12 channels, exactly the
way Qwen-Image packs 2x2 latent patches. The text encoder is ours: a word embedding of
its task's vocabulary (MiniGenEval's words, or MiniOCR's characters) and one transformer
layer. A saved policy is a folder: `transformer/` in diffusers' format (so `from_pretrained`
loads it, as it would a real checkpoint), `text_encoder.safetensors` and `policy.json`.

Example:
    policy = build_policy(PolicyConfig())          # random init, CPU
    emb, mask = policy.encode_prompts(["a red circle"])
    v_N3HW = policy.velocity(x_N3HW, sigma_N, emb, mask)
    save_policy(policy, "ckpt/"); policy = load_policy("ckpt/")
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from workers.algo.sde import sigma_schedule
from workers.task import miniocr
from workers.task.prompts import MAX_PROMPT_WORDS, VOCAB, tokenize

SHIPPED_BASE = Path(__file__).parent / "checkpoints" / "base"
"""The base checkpoint shipped in the repo (made by `spotlight pretrain`, see docs/BASE_MODEL.md)."""
SHIPPED_OCR_BASE = Path(__file__).parent / "checkpoints" / "base_ocr"
"""The MiniOCR base (`spotlight pretrain --task miniocr`, docs/BASE_MODEL.md)."""


@dataclass(frozen=True)
class TaskText:
    """What a task's prompts become for the text encoder: its vocabulary, positions and tokenizer."""

    vocab: tuple[str, ...]
    max_tokens: int
    tokenize: Callable[[list[str]], tuple[list[list[int]], list[int]]]


TASKS: dict[str, TaskText] = {
    "minigeneval": TaskText(VOCAB, MAX_PROMPT_WORDS, tokenize),
    "miniocr": TaskText(miniocr.VOCAB, miniocr.MAX_TOKENS, miniocr.tokenize_ocr),
}
"""The tasks the pixel policy's text encoder can read, by name (PolicyConfig.task)."""


def shipped_base_for(prompts_path: str | None) -> Path:
    """The shipped base a run starts from when it names none: MiniOCR's for MiniOCR's prompts file, else
    MiniGenEval's."""
    if prompts_path is not None and Path(prompts_path) == miniocr.MINIOCR_PROMPTS.resolve():
        return SHIPPED_OCR_BASE
    return SHIPPED_BASE


@dataclass(frozen=True)
class PolicyConfig:
    image_size: int = 32
    """Square image side in pixels; a multiple of patch_size."""
    patch_size: int = 2
    num_layers: int = 4
    """Dual-stream QwenImage transformer blocks."""
    num_heads: int = 4
    head_dim: int = 32
    text_dim: int = 64
    """Width of the text encoder's output (the transformer's joint_attention_dim)."""
    rope_axes: tuple[int, int, int] = (8, 12, 12)
    """RoPE dims for (frame, height, width); they must sum to head_dim."""
    task: str = "minigeneval"
    """Whose prompts the text encoder reads: "minigeneval" or "miniocr" (TASKS)."""

    def __post_init__(self):
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size={self.image_size} must be a multiple of patch_size={self.patch_size}")
        if sum(self.rope_axes) != self.head_dim:
            raise ValueError(f"rope_axes={self.rope_axes} must sum to head_dim={self.head_dim}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {sorted(TASKS)}, got {self.task!r}")
        for name in ("num_layers", "num_heads", "head_dim", "text_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def tokens_per_side(self) -> int:
        return self.image_size // self.patch_size


class TextEncoder(nn.Module):
    """Word embedding + learned positions + one transformer layer -> (B, L, text_dim)."""

    def __init__(self, text_dim: int, task: str = "minigeneval"):
        super().__init__()
        self.embed = nn.Embedding(len(TASKS[task].vocab), text_dim)
        self.pos = nn.Parameter(torch.randn(TASKS[task].max_tokens, text_dim) * 0.02)
        self.layer = nn.TransformerEncoderLayer(
            text_dim, nhead=4, dim_feedforward=2 * text_dim, dropout=0.0, batch_first=True, norm_first=True
        )

    def forward(self, ids_BL: torch.Tensor, mask_BL: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids_BL) + self.pos[: ids_BL.shape[1]]
        # No fused inference fast path: in fp32 it rounds differently from the training path,
        # and a rollout's log-probs must equal the trainer's recomputation bit for bit.
        fast = torch.backends.mha.get_fastpath_enabled()
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            return self.layer(h, src_key_padding_mask=~mask_BL)
        finally:
            torch.backends.mha.set_fastpath_enabled(fast)


class Policy(nn.Module):
    def __init__(self, config: PolicyConfig, transformer: nn.Module, text_encoder: TextEncoder):
        super().__init__()
        self.config = config
        self.transformer = transformer
        self.text_encoder = text_encoder

    # The model interface every family shares (workers/model/families/ for diffusers pipelines):
    # what is sampled, how it becomes an image, and which weights train, sync and checkpoint.
    @property
    def latent_shape(self) -> tuple[int, ...]:
        """One sample's shape in the space the sampler walks: pixels here, (3, H, W)."""
        return (3, self.config.image_size, self.config.image_size)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Samples -> images (N, 3, H, W) in [-1, 1]; this policy samples pixels, so they already are."""
        return latents

    def sigmas(self, num_steps: int, shift: float = 1.0) -> torch.Tensor:
        """The sampler's noise levels (num_steps + 1, from 1 to 0)."""
        return sigma_schedule(num_steps, shift).float()

    def weights(self) -> dict[str, torch.Tensor]:
        """The weights that train, sync (PULSE) and checkpoint: all of them for this policy."""
        return self.state_dict()

    def load_weights(self, tensors: dict[str, torch.Tensor], assign: bool = False) -> None:
        """Copy `tensors` into the parameters; `assign`: make them the parameters (their dtype, their memory)."""
        self.load_state_dict(tensors, assign=assign)

    def trainable_parameters(self):
        return self.parameters()

    def spec(self) -> dict:
        """What any process needs to rebuild this architecture (`workers.model.policy_loader.build_from_spec`)."""
        return asdict(self.config)

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Text embeddings (B, L, text_dim) and the bool mask (B, L) of real words."""
        text = TASKS[self.config.task]
        ids, lengths = text.tokenize(prompts)
        device = next(self.parameters()).device
        ids_t = torch.tensor(ids, device=device)
        mask = torch.arange(text.max_tokens, device=device)[None, :] < torch.tensor(lengths, device=device)[:, None]
        return self.text_encoder(ids_t, mask), mask

    def velocity(
        self, x_N3HW: torch.Tensor, sigma_N: torch.Tensor, emb: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """The flow-matching velocity (noise - data) predicted at noise level sigma."""
        n = x_N3HW.shape[0]
        side = self.config.tokens_per_side
        out = self.transformer(
            hidden_states=patchify(x_N3HW, self.config.patch_size),
            encoder_hidden_states=emb,
            encoder_hidden_states_mask=mask,
            timestep=sigma_N.to(x_N3HW.dtype),
            img_shapes=[(1, side, side)] * n,
            return_dict=False,
        )[0]
        return unpatchify(out, self.config.patch_size, self.config.image_size)


def patchify(x_N3HW: torch.Tensor, p: int) -> torch.Tensor:
    """(N, C, H, W) -> (N, (H/p)(W/p), C p p): Qwen-Image's 2x2 packing."""
    n, c, h, w = x_N3HW.shape
    x = x_N3HW.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(n, (h // p) * (w // p), c * p * p)


def unpatchify(tokens: torch.Tensor, p: int, size: int) -> torch.Tensor:
    """Inverse of patchify for square images of side `size`."""
    n, _, d = tokens.shape
    c, s = d // (p * p), size // p
    x = tokens.reshape(n, s, s, c, p, p).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(n, c, size, size)


def _make_transformer(config: PolicyConfig) -> nn.Module:
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(
        patch_size=config.patch_size,
        in_channels=3 * config.patch_size**2,
        out_channels=3,
        num_layers=config.num_layers,
        attention_head_dim=config.head_dim,
        num_attention_heads=config.num_heads,
        joint_attention_dim=config.text_dim,
        axes_dims_rope=config.rope_axes,
    )


def build_policy(config: PolicyConfig, seed: int = 0) -> Policy:
    """A randomly initialised policy (deterministic in seed)."""
    torch.manual_seed(seed)
    return Policy(config, _make_transformer(config), TextEncoder(config.text_dim, config.task))


def with_task(policy: Policy, task: str, seed: int = 0) -> Policy:
    """`policy` reading `task`'s prompts: the same transformer (what it learnt of images carries over) with a new,
    randomly initialised text encoder for the task's vocabulary; `policy` itself when it already reads them."""
    if policy.config.task == task:
        return policy
    config = replace(policy.config, task=task)  # ValueError for an unknown task
    torch.manual_seed(seed)
    return Policy(config, policy.transformer, TextEncoder(config.text_dim, task))


def save_policy(policy: Policy, path: str | Path) -> None:
    """Write the policy folder (diffusers transformer, safetensors text encoder, json config)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    policy.transformer.save_pretrained(path / "transformer", safe_serialization=True)
    state = {k: v.detach().contiguous() for k, v in policy.text_encoder.state_dict().items()}
    save_file(state, str(path / "text_encoder.safetensors"))
    meta = {"policy_config": asdict(policy.config), "vocab": list(TASKS[policy.config.task].vocab)}
    (path / "policy.json").write_text(json.dumps(meta, indent=2))


def load_policy(path: str | Path = SHIPPED_BASE) -> Policy:
    """Load a policy folder from local disk (never downloads); fp32 weights."""
    from diffusers import QwenImageTransformer2DModel
    from safetensors.torch import load_file

    path = Path(path)
    meta_path = path / "policy.json"
    if not meta_path.is_file():
        raise FileNotFoundError(
            f"{path} is not a spotlight policy folder (no policy.json); "
            "make one with `spotlight pretrain --out DIR` or `save_policy`"
        )
    meta = json.loads(meta_path.read_text())
    cfg = meta["policy_config"]
    config = PolicyConfig(**{**cfg, "rope_axes": tuple(cfg["rope_axes"])})
    if meta.get("vocab") != list(TASKS[config.task].vocab):
        raise ValueError(f"{path}: its text vocabulary differs from this version's {config.task} vocabulary")
    transformer = QwenImageTransformer2DModel.from_pretrained(
        path / "transformer", torch_dtype=torch.float32, local_files_only=True, low_cpu_mem_usage=False
    )
    text_encoder = TextEncoder(config.text_dim, config.task)
    text_encoder.load_state_dict(load_file(str(path / "text_encoder.safetensors")))
    return Policy(config, transformer, text_encoder)
