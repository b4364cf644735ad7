"""A GPT-2-style decoder-only LM and an AdamW trajectory on a synthetic next-token task.

It gives PULSE benchmarks and tests realistic weight updates: FP32 master weights,
AdamW at an RL learning rate, weights moved off their fresh initialisation first.

Example:
    config = lm_50m()
    for state_bf16 in lm_trajectory(config, TrajectoryConfig(num_states=65)):
        ...
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LMConfig:
    """Shape of the decoder-only transformer."""

    vocab_size: int = 8192
    """Tokens in the vocabulary (the output head is tied to the embedding)."""
    d_model: int = 512
    """Residual stream width."""
    num_layers: int = 16
    """Transformer blocks."""
    num_heads: int = 8
    """Attention heads; must divide d_model."""
    max_seq_len: int = 64
    """Learned positions."""

    def __post_init__(self) -> None:
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide d_model ({self.d_model})")


@dataclass(frozen=True)
class TrajectoryConfig:
    """Training run whose BF16 snapshots form the trajectory."""

    warmup_steps: int = 30
    """Steps at warmup_lr that move the weights off their fresh initialisation."""
    warmup_lr: float = 3e-4
    """Learning rate of the warm-up."""
    settle_steps: int = 150
    """Steps at lr before the first snapshot (Adam moments adapt to the new lr)."""
    num_states: int = 65
    """Snapshots yielded, one per optimizer step at lr (the first is before any of those steps)."""
    lr: float = 3e-6
    """The RL-like learning rate of the measured steps."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay."""
    batch_size: int = 2
    """Sequences per step."""
    seq_len: int = 32
    """Tokens per sequence."""
    seed: int = 0
    """Seeds the initialisation and the synthetic data."""

    def __post_init__(self) -> None:
        if self.num_states < 1 or self.warmup_steps < 0 or self.settle_steps < 0:
            raise ValueError("num_states must be >= 1 and warmup_steps, settle_steps >= 0")
        if not 0 < self.lr < 1 or not 0 < self.warmup_lr < 1:
            raise ValueError(f"learning rates must lie in (0, 1), got lr={self.lr}, warmup_lr={self.warmup_lr}")


def lm_50m() -> LMConfig:
    """54.5M parameters: 16 layers of width 512, vocabulary 8192."""
    return LMConfig()


def lm_tiny() -> LMConfig:
    """0.6M parameters for smoke runs and tests."""
    return LMConfig(vocab_size=512, d_model=96, num_layers=4, num_heads=4, max_seq_len=32)


class Block(nn.Module):
    """Pre-LayerNorm attention + MLP block."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.ln1 = nn.LayerNorm(config.d_model)
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.attn_out = nn.Linear(config.d_model, config.d_model)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp_in = nn.Linear(config.d_model, 4 * config.d_model)
        self.mlp_out = nn.Linear(4 * config.d_model, config.d_model)

    def forward(self, x_BTC: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x_BTC.shape
        q, k, v = self.qkv(self.ln1(x_BTC)).split(channels, dim=2)
        heads = [t.view(batch, time, self.num_heads, -1).transpose(1, 2) for t in (q, k, v)]
        attn = F.scaled_dot_product_attention(*heads, is_causal=True)
        x_BTC = x_BTC + self.attn_out(attn.transpose(1, 2).reshape(batch, time, channels))
        return x_BTC + self.mlp_out(F.gelu(self.mlp_in(self.ln2(x_BTC))))


class TinyLM(nn.Module):
    """GPT-2 layout: token + position embeddings, blocks, final LayerNorm, tied head."""

    def __init__(self, config: LMConfig) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = nn.Embedding(config.max_seq_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.ln_final = nn.LayerNorm(config.d_model)
        self._init_weights(config)

    def _init_weights(self, config: LMConfig) -> None:
        # GPT-2: N(0, 0.02) everywhere, residual projections scaled by 1/sqrt(2 * layers)
        # so the residual stream's variance does not grow with depth.
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear):
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            for projection in (block.attn_out, block.mlp_out):
                nn.init.normal_(projection.weight, std=0.02 / math.sqrt(2 * config.num_layers))

    def forward(self, tokens_BT: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens_BT.shape[1], device=tokens_BT.device)
        x_BTC = self.token_embedding(tokens_BT) + self.position_embedding(positions)
        for block in self.blocks:
            x_BTC = block(x_BTC)
        return self.ln_final(x_BTC) @ self.token_embedding.weight.T


def markov_batch(
    successors_VS: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> torch.Tensor:
    """Token sequences from a sparse random Markov chain (each token has a few successors)."""
    vocab_size, num_successors = successors_VS.shape
    tokens = torch.empty(batch_size, seq_len, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab_size, (batch_size,), generator=generator)
    choices = torch.randint(num_successors, (batch_size, seq_len), generator=generator)
    for position in range(1, seq_len):
        tokens[:, position] = successors_VS[tokens[:, position - 1], choices[:, position]]
    return tokens


def lm_trajectory(config: LMConfig, run: TrajectoryConfig) -> Iterator[dict[str, torch.Tensor]]:
    """Yield BF16 snapshots of the model after each optimizer step at run.lr."""
    torch.manual_seed(run.seed)
    generator = torch.Generator().manual_seed(run.seed)
    model = TinyLM(config)
    successors_VS = torch.randint(config.vocab_size, (config.vocab_size, 4), generator=generator)
    # fused: the same AdamW update, ~9x faster on CPU than the foreach kernels.
    optimizer = torch.optim.AdamW(model.parameters(), lr=run.warmup_lr, weight_decay=run.weight_decay, fused=True)

    def step() -> None:
        tokens = markov_batch(successors_VS, run.batch_size, run.seq_len + 1, generator)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, config.vocab_size), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(run.warmup_steps):
        step()
    for group in optimizer.param_groups:
        group["lr"] = run.lr
    for _ in range(run.settle_steps):
        step()
    log.info("lm trajectory: %d warm-up and %d settle steps done", run.warmup_steps, run.settle_steps)
    for index in range(run.num_states):
        if index:
            step()
        yield {name: tensor.detach().to(torch.bfloat16) for name, tensor in model.state_dict().items()}


def num_parameters(config: LMConfig) -> int:
    """Parameter count of TinyLM(config) (the tied head counted once)."""
    return sum(p.numel() for p in TinyLM(config).parameters())
