"""The local training tasks a PULSELoCo replica runs: the LM-shaped synthetic task and tiny-DiT GRPO.

A task owns its model (FP32 master weights) and inner AdamW, trains on this replica's
shard of the data, and evaluates on a fixed held-out set identical on every replica.

Example:
    task = build_task(TaskConfig(name="lm"), replica=0, num_replicas=2, start=start_state)
    metric = task.local_step(step)          # one inner optimizer step
    score = task.evaluate()                 # {"metric": ..., "stderr": ..., "values": [...]}
    view = evaluate_bf16_view(task)         # the same, on the weights rounded to BF16
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from workers.model.tiny_policy import SHIPPED_BASE, load_policy
from workers.pulse.loco.tiny_lm import TinyLM, lm_50m, lm_tiny, markov_batch
from workers.task.detector import score_images
from workers.task.evaluate import evaluate
from workers.task.prompts import split_prompts
from workers.trainer.grpo_trainer import GRPOTrainer
from workers.trainer.presets import PRESETS, get_preset

TASKS = ("lm", "dit")
ADAM_PREFIX = "adam."
"""Start-state keys holding AdamW's moments (never a parameter name of TinyLM)."""


@dataclass(frozen=True)
class TaskConfig:
    """Which local task the replicas train, and at what inner learning rate."""

    name: str = "lm"
    """lm (the LM-shaped synthetic task of `bench pulse`) or dit (tiny-DiT GRPO on MiniGenEval, see dit_preset)."""
    size: str = "tiny"
    """lm only: tiny (0.6M parameters) or 50m (54.7M, as in `bench pulse`)."""
    lr: float = 3e-6
    """Inner AdamW learning rate (RL range: 1e-6 .. 1e-4)."""
    warmup_steps: int = 30
    """lm only: steps at warmup_lr before the run, so weights have trained magnitudes."""
    warmup_lr: float = 3e-4
    """lm only: learning rate of the warm-up."""
    settle_steps: int = 150
    """lm only: steps at lr after the warm-up so AdamW's moments settle (as in `bench pulse`); replicas inherit them."""
    batch_size: int = 2
    """lm: sequences per step; dit: prompts per step (each with group_size samples)."""
    group_size: int = 4
    """dit only: GRPO samples per prompt."""
    eval_batches: int = 8
    """lm: held-out batches; dit: held-out prompts (2 seeds each, ODE sampler)."""
    dit_preset: str = "cpu_tiny"
    """dit only: the training preset whose GRPO recipe (objective, sampler) the replicas run,
    at this config's lr (constant: no warm-up), batch and group size, one optimizer step per local step."""
    seed: int = 0
    """Seeds the model, the task and every replica's data shard."""

    def __post_init__(self) -> None:
        if self.name not in TASKS:
            raise ValueError(f"TaskConfig.name must be one of {TASKS}, got {self.name!r}")
        if self.size not in ("tiny", "50m"):
            raise ValueError(f"TaskConfig.size must be 'tiny' or '50m', got {self.size!r}")
        if not 0 < self.lr <= 1e-2 or not 0 < self.warmup_lr <= 1e-2:
            raise ValueError(f"TaskConfig.lr and warmup_lr must be in (0, 1e-2], got {self.lr}, {self.warmup_lr}")
        if self.warmup_steps < 0 or self.settle_steps < 0:
            raise ValueError(
                f"TaskConfig.warmup_steps and settle_steps must be >= 0, got {self.warmup_steps}, {self.settle_steps}"
            )
        if self.batch_size < 1 or self.eval_batches < 1 or self.group_size < 2:
            raise ValueError("TaskConfig.batch_size and eval_batches must be >= 1, group_size >= 2")
        if self.name == "dit":
            if self.dit_preset not in PRESETS:
                raise ValueError(f"TaskConfig.dit_preset must be one of {sorted(PRESETS)}, got {self.dit_preset!r}")


class LocalTask(Protocol):
    """What a replica needs from its training task."""

    optimizer: torch.optim.Optimizer

    def parameters_by_name(self) -> dict[str, torch.nn.Parameter]: ...

    def local_step(self, step: int) -> float: ...

    def evaluate(self) -> dict:
        """Held-out {"metric", "stderr", "values"}: values per held-out item, in a fixed order, so two
        models' values pair up."""
        ...


def evaluate_bf16_view(task: LocalTask) -> dict:
    """The held-out evaluation of the task's weights rounded to BF16 (what PULSE syncs to rollout
    workers); the FP32 weights are restored afterwards."""
    params = task.parameters_by_name()
    saved = {name: p.detach().clone() for name, p in params.items()}
    try:
        with torch.no_grad():
            for p in params.values():
                p.copy_(p.to(torch.bfloat16))
        return task.evaluate()
    finally:
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(saved[name])


class LMTask:
    """Next-token prediction on a sparse random Markov chain; replica r draws its own batches."""

    def __init__(self, config: TaskConfig, replica: int, start: dict[str, torch.Tensor] | None) -> None:
        self.config = config
        self.model_config = lm_tiny() if config.size == "tiny" else lm_50m()
        torch.manual_seed(config.seed)
        self.model = TinyLM(self.model_config)
        generator = torch.Generator().manual_seed(config.seed)
        self.successors = torch.randint(
            self.model_config.vocab_size, (self.model_config.vocab_size, 4), generator=generator
        )
        self.shard = torch.Generator().manual_seed(config.seed * 1_000 + 1 + replica)
        # fused: the same AdamW update, ~9x faster on CPU than the foreach kernels.
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, weight_decay=0.1, fused=True)
        if start is not None:
            self._load_start(start)

    def _load_start(self, start: dict[str, torch.Tensor]) -> None:
        """Weights, and AdamW's moments when the start carries them (keys adam.*)."""
        self.model.load_state_dict({k: v for k, v in start.items() if not k.startswith(ADAM_PREFIX)})
        if ADAM_PREFIX + "step" not in start:
            return
        for name, param in self.model.named_parameters():
            self.optimizer.state[param] = {
                "step": start[ADAM_PREFIX + "step"].clone(),
                "exp_avg": start[f"{ADAM_PREFIX}exp_avg.{name}"].clone(),
                "exp_avg_sq": start[f"{ADAM_PREFIX}exp_avg_sq.{name}"].clone(),
            }

    def start_state(self) -> dict[str, torch.Tensor]:
        """Weights plus AdamW's moments, in the form _load_start reads."""
        state = {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}
        for name, param in self.model.named_parameters():
            moments = self.optimizer.state.get(param)
            if moments:
                state[ADAM_PREFIX + "step"] = moments["step"].detach().clone()
                state[f"{ADAM_PREFIX}exp_avg.{name}"] = moments["exp_avg"].detach().clone()
                state[f"{ADAM_PREFIX}exp_avg_sq.{name}"] = moments["exp_avg_sq"].detach().clone()
        return state

    def parameters_by_name(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.model.named_parameters())

    def _loss(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self.model(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, self.model_config.vocab_size), tokens[:, 1:].reshape(-1))

    def local_step(self, step: int) -> float:
        tokens = markov_batch(self.successors, self.config.batch_size, 33, self.shard)
        loss = self._loss(tokens)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.item()

    def evaluate(self) -> dict:
        generator = torch.Generator().manual_seed(10_000_019 + self.config.seed)
        with torch.no_grad():
            losses = [
                float(self._loss(markov_batch(self.successors, 8, 33, generator)))
                for _ in range(self.config.eval_batches)
            ]
        return _mean_and_stderr(losses)


def lm_start_state(config: TaskConfig) -> dict[str, torch.Tensor]:
    """The shared starting point of every replica: the LM after its warm-up (trained magnitudes)
    and settle steps at the run's lr (AdamW's moments adapted to it), moments included."""
    task = LMTask(dataclasses.replace(config, lr=config.warmup_lr), replica=-1, start=None)
    for step in range(config.warmup_steps):
        task.local_step(step)
    for group in task.optimizer.param_groups:
        group["lr"] = config.lr
    for step in range(config.settle_steps):
        task.local_step(step)
    return task.start_state()


class DiTTask:
    """GRPO on the shipped tiny DiT; replica r samples iterations r, r + R, r + 2R, ... of the prompt schedule."""

    def __init__(self, config: TaskConfig, replica: int, num_replicas: int) -> None:
        base = get_preset(config.dit_preset)
        train_config = dataclasses.replace(
            base,
            prompts_per_iteration=config.batch_size,
            group_size=config.group_size,
            seed=config.seed,
            grpo=dataclasses.replace(
                base.grpo, lr=config.lr, lr_warmup_steps=0, lr_schedule="constant", num_epochs=1, num_minibatches=1
            ),
        )
        self.config, self.replica, self.num_replicas = config, replica, num_replicas
        self.policy = load_policy(SHIPPED_BASE)
        self.trainer = GRPOTrainer(self.policy, train_config)
        self.optimizer = self.trainer.optimizer
        self.heldout = split_prompts()["heldout"][: config.eval_batches]

    def parameters_by_name(self) -> dict[str, torch.nn.Parameter]:
        return {name: p for name, p in self.policy.named_parameters() if p.requires_grad}

    def local_step(self, step: int) -> float:
        # Disjoint prompt shards: replica r takes iterations r, r + R, ... of the schedule.
        batch = self.trainer.collect(1 + step * self.num_replicas + self.replica)
        self.trainer.update(batch)
        return float(batch.rewards.mean())

    def evaluate(self) -> dict:
        result = evaluate(self.policy, self.heldout, seeds_per_prompt=2, keep_images=True)
        return _mean_and_stderr([s.partial for s in score_images(result.images, result.prompts)])


def build_task(
    config: TaskConfig, replica: int, num_replicas: int, start: dict[str, torch.Tensor] | None = None
) -> LocalTask:
    """The replica's task; every replica of one run must get the same config and start."""
    if config.name == "lm":
        return LMTask(config, replica, start)
    return DiTTask(config, replica, num_replicas)


def _mean_and_stderr(values: list[float]) -> dict:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)
    return {"metric": mean, "stderr": math.sqrt(var / len(values)), "values": [float(v) for v in values]}
