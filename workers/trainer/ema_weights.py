"""The EMA of the trained weights across iterations (train.ema; the maths: workers/algo/ema.py): saved in each
checkpoint beside the weights as `ema.<name>` tensors, restored into the next update's trainer, and swapped into the
policy while validation scores it, as flow_grpo's scripts/train_sd3.py `eval` and `save_ckpt` do (`copy_ema_to`,
then `copy_temp_to`). Rollouts always sample the live weights.

Example:
    trainer.ema_weights = saved_ema(store, run, k)                 # None at version 0: the update starts one
    publish_checkpoint(store, run, k + 1, spec, weights, optimizer, ema=trainer.ema_weights)
    with evaluated_policy(policy, train, store, run, k + 1) as (view, sampler):
        plan.evaluate(view, seeds, sampler)
"""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Iterator

import torch

from resources.keys import weights_key
from resources.store.base import TensorStore
from workers.algo.ema import ema_due, ema_update
from workers.algo.sampler import SamplerConfig
from workers.task.prompt_file import negative_prompts
from workers.task.prompt_row import set_row_negatives
from workers.trainer.train_config import TrainConfig

EMA_PREFIX = "ema."


def start_ema(trainer) -> None:
    """With train.ema, a trainer (workers/trainer/grpo_trainer.py) without an EMA starts one at its weights (FP32):
    flow_grpo's starts at the initial trainable parameters."""
    if trainer.config.ema is not None and trainer.ema_weights is None:
        trainer.ema_weights = {k: v.detach().float().clone() for k, v in _whole_weights(trainer).items()}


def step_ema(trainer) -> None:
    """After an optimizer step: move the trainer's EMA towards its weights when the interval says so (every rank
    together under FSDP2, whose whole weights are a collective)."""
    ema, step = trainer.config.ema, trainer.steps_done()
    if trainer.ema_weights is not None and ema is not None and ema_due(step, ema):
        ema_update(trainer.ema_weights, _whole_weights(trainer), step, ema)


def _whole_weights(trainer) -> dict[str, torch.Tensor]:
    """The trainer's `policy.weights()`, gathered whole to the CPU when FSDP2 shards the policy (a collective)."""
    if trainer.data_shard is None:
        return trainer.policy.weights()
    from workers.trainer.fsdp import full_weights  # lazy: fsdp pulls torch.distributed

    return full_weights(trainer.policy)


def saved_ema(store: TensorStore, run: str, version: int) -> dict[str, torch.Tensor] | None:
    """The EMA checkpoint `version` saved (FP32, by weight name), or None when it saved none."""
    manifest = store.read_manifest(weights_key(run, version))
    if manifest is None or not manifest.metadata.get("ema"):
        return None
    tensors = store.load_tensors(weights_key(run, version))
    return {k[len(EMA_PREFIX) :]: v.float() for k, v in tensors.items() if k.startswith(EMA_PREFIX)}


def evaluation_sampler(train: TrainConfig) -> SamplerConfig:
    """The sampler validation walks: the run's, with validation_steps when set (flow_grpo's eval_num_steps)."""
    if train.validation_steps is None:
        return train.sampler
    return dataclasses.replace(train.sampler, num_steps=train.validation_steps, sde_window=None)


@contextmanager
def evaluated_policy(
    policy, train: TrainConfig, store: TensorStore, run: str, version: int
) -> Iterator[tuple[object, SamplerConfig]]:
    """(the policy validation scores, its sampler): with train.ema, `policy` holding version's EMA weights for the
    block (the live weights come back after it); with eval_guidance, a view at that guidance."""
    set_row_negatives(policy, negative_prompts(train.prompts))  # held-out rows' own negative prompts
    ema = saved_ema(store, run, version) if train.ema is not None else None
    view = policy if train.eval_guidance is None else policy.at(guidance=train.eval_guidance)
    with ema_swapped(policy, ema):
        yield view, evaluation_sampler(train)


@contextmanager
def ema_swapped(policy, ema: dict[str, torch.Tensor] | None) -> Iterator[None]:
    """`policy` holding the `ema` weights for the block, its live weights back after it (None: nothing swapped)."""
    if ema is None:
        yield
        return
    # The live weights wait on the CPU: under full fine-tuning a second copy on the GPU would not fit beside them.
    live = {k: v.detach().to("cpu", copy=True) for k, v in policy.weights().items()}
    try:
        with torch.no_grad():
            policy.load_weights(ema)
        yield
    finally:
        with torch.no_grad():
            policy.load_weights(live)
