"""The train phase as one call: trainer state from the store, GRPO update on the iteration's results, new state back.

Alone, this process does all of it. As rank 0 of `spotlight train --nproc N` (workers/trainer/ranks.py) it first
orders the other ranks to join: every rank loads the checkpoint and the batch from the store and takes its slice of
each minibatch under FSDP2 (workers/trainer/fsdp.py); each rank stores its shards of the optimizer state
(workers/trainer/sharded_optimizer.py), the whole weights are gathered, and rank 0 alone publishes the next
checkpoint.

Example:
    stats = train_iteration(store, "demo", config, 3, requests)   # checkpoint v3 -> v4
    follow_orders(current_setup())                                # ranks 1..N-1, until rank 0 stops them
"""

from __future__ import annotations

from dataclasses import dataclass

from resources.keys import weights_key
from resources.store import open_store
from resources.store.base import TensorStore
from workers.coordinator.rollout import PlannedRequest, RolloutOrder, load_batch, sample_part
from workers.trainer.checkpoint import (
    OptimizerState,
    checkpoint_metadata,
    load_checkpoint,
    publish_checkpoint,
    restore_optimizer,
)
from workers.trainer.checkpoint import (
    optimizer_state as saved_optimizer_state,
)
from workers.trainer.ema_weights import saved_ema
from workers.trainer.fsdp import distribute, load_optimizer_state, replicate
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig
from workers.trainer.memory import enable_gradient_checkpointing, gradient_checkpointing_enabled
from workers.trainer.optimizer_state import SHARDED_FORMAT
from workers.trainer.ranks import TrainerSetup, current_setup
from workers.trainer.resident import (
    forget_version,
    mark_version,
    release_memory,
    resident_checkpoint,
    resident_policy,
)
from workers.trainer.sharded_load import empty_policy
from workers.trainer.sharded_optimizer import load_sharded, save_sharded
from workers.trainer.shared_base import gather_weights, resident_for


@dataclass(frozen=True)
class TrainOrder:
    """What rank 0 sends the other ranks: one train phase, read from the same store."""

    store_url: str
    run: str
    config: TrainConfig
    iteration: int
    requests: list[PlannedRequest]
    device: str


def train_iteration(
    store: TensorStore,
    run: str,
    config: TrainConfig,
    iteration: int,
    requests: list[PlannedRequest],
    device: str = "cpu",
) -> dict[str, float]:
    """Update weights version `iteration` into `iteration + 1` on the iteration's committed results;
    returns the batch's reward statistics and the update's loss statistics."""
    setup, order = current_setup(), TrainOrder(store.url, run, config, iteration, requests, device)
    if setup.ranks is not None:
        setup.ranks.send(order)  # the other ranks join this update
    return _update_version(store, order, setup)


def follow_orders(setup: TrainerSetup) -> int:
    """Ranks 1..N-1: sample their part of each in-process rollout phase and join each train phase rank 0 orders,
    until it sends None; returns how many train phases were joined."""
    joined = 0
    while (order := setup.ranks.receive()) is not None:
        if isinstance(order, RolloutOrder):
            sample_part(open_store(order.store_url), order, setup.ranks)
            continue
        _update_version(open_store(order.store_url), order, setup)
        joined += 1
    return joined


def _update_version(store: TensorStore, order: TrainOrder, setup: TrainerSetup) -> dict[str, float]:
    """One update on this process (and, with ranks, the others): checkpoint k -> k+1; rank 0 publishes it."""
    config, run, k = order.config, order.run, order.iteration
    rank0 = setup.ranks is None or setup.ranks.rank == 0
    # One base per rank: alone, and under LoRA on every rank, the resident policy (the one that samples) trains in
    # place. Full fine-tuning under ranks trains an FSDP2 copy built empty on every rank and filled from rank 0's
    # resident weights; the trained weights are gathered back into each rank's resident policy.
    policy, optimizer_state = _trained_copy(store, run, k, order.device, setup)
    in_place = policy is resident_policy()
    if in_place:
        forget_version()  # until the update is published, the resident weights match no checkpoint

    if setup.gradient_checkpointing:
        enable_gradient_checkpointing(policy)
    elif gradient_checkpointing_enabled(policy):  # a resident policy a checkpointed run of this process left so
        policy.transformer.disable_gradient_checkpointing()
    # The KL reference is the run's starting policy, version 0. Under LoRA that is the base itself (a fresh
    # adapter's B is 0): the trainer runs it with the adapter disabled, so no second transformer is loaded.
    reference = None
    if config.grpo.kl_beta > 0 and not getattr(policy, "is_lora", False):
        reference = _trained_copy(store, run, 0, order.device, setup, shared=False)[0]
    trainer = GRPOTrainer(policy, config, reference=reference)
    _restore(trainer, optimizer_state, setup, store, run, k, order.device)
    if config.ema is not None:
        trainer.ema_weights = saved_ema(store, run, k)  # None at the base: the update starts it from the weights
    batch = load_batch(store, run, config, k, order.requests)
    # Old log-probs from the trainer's own forward: the stored ones come from whatever sampled (queue
    # workers run BF16-rounded weights), and with a 1e-4 clip range that alone clips the first minibatch.
    stats = {**trainer.batch_stats(batch), **trainer.update(batch, recompute_old_log_probs=True)}
    resident = None if in_place else resident_for(policy)
    if resident is not None:
        forget_version()  # the trained weights are gathered into it next
    weights, optimizer = _saved_state(store, weights_key(run, k + 1), trainer, resident)
    if rank0:
        stats["checkpoint_bytes"] = publish_checkpoint(
            store, run, k + 1, policy.spec(), weights, optimizer, ema=trainer.ema_weights
        )
        if k >= 2:
            # Only versions k, k+1 (a redone iteration k needs k) and 0 (the KL reference) stay: FP32
            # weights plus AdamW state are 3x the model, per version. Older weights live on in the PULSE chain.
            store.delete_commit(weights_key(run, k - 1))
    if in_place or resident is not None:
        mark_version(store, run, k + 1)  # the resident policy holds exactly what was published
    policy.zero_grad(set_to_none=True)  # gradients and the trainer's AdamW state go before the next phase
    del trainer, weights, optimizer, batch
    release_memory()
    return stats


def _trained_copy(store: TensorStore, run: str, version: int, device: str, setup: TrainerSetup, shared: bool = True):
    """(policy at `version`, its optimizer state): the resident policy when `shared`, alone or under LoRA; else,
    under ranks, the policy built empty (workers/trainer/sharded_load.py; filled from rank 0 in `_restore`), the
    optimizer state read by all; a frozen copy (`shared` False) loaded whole on rank 0."""
    alone = setup.ranks is None
    if shared and (alone or lora_spec(store, run, version)):
        return resident_checkpoint(store, run, version, device)
    if alone or (setup.ranks.rank == 0 and not shared):
        return load_checkpoint(store, run, version, device)
    meta = checkpoint_metadata(store, run, version)
    whole_optimizer = meta.get("optimizer") is not None and meta["optimizer"].get("format") != SHARDED_FORMAT
    tensors = store.load_tensors(weights_key(run, version)) if whole_optimizer else {}
    return empty_policy(store, run, version), saved_optimizer_state(store, meta, tensors)


def lora_spec(store: TensorStore, run: str, version: int) -> bool:
    """True when checkpoint `version` holds a LoRA policy (its base stays whole on every rank)."""
    return int(checkpoint_metadata(store, run, version)["policy_config"].get("lora_rank", 0) or 0) > 0


def _restore(
    trainer: GRPOTrainer,
    optimizer_state: OptimizerState | None,
    setup: TrainerSetup,
    store: TensorStore,
    run: str,
    version: int,
    device: str,
) -> None:
    """Make the trainer data-parallel over the ranks (if any), then load the saved AdamW state into its optimizer:
    whole alone and on replicated ranks (LoRA), each rank its own shards under FSDP2 (a state saved whole is cut
    locally on every rank)."""
    if setup.ranks is None or trainer.policy is resident_policy():
        if setup.ranks is not None:
            replicate(trainer, setup.ranks.mesh)
        restore_optimizer(trainer.optimizer, optimizer_state)
        return

    source = resident_checkpoint(store, run, version, device)[0] if setup.ranks.rank == 0 else None
    distribute(trainer, setup.ranks.mesh, from_rank0=True, source=source)
    if optimizer_state is not None and optimizer_state.sharded:
        load_sharded(optimizer_state.store, optimizer_state.meta, trainer.optimizer)
    elif optimizer_state is not None:
        load_optimizer_state(trainer.optimizer, optimizer_state.to_state_dict())


def _saved_state(store: TensorStore, key: str, trainer: GRPOTrainer, resident) -> tuple[dict, dict]:
    """The trained weights, whole, and what the checkpoint at `key` holds of the optimizer: alone and on replicated
    ranks, the policy's weights and the optimizer's state dict; under FSDP2 the weights gathered from the shards
    (into this rank's resident policy when it has one) and the metadata of the optimizer shards every rank has just
    stored."""
    if trainer.data_shard is None or trainer.data_shard.replicated:
        return trainer.policy.weights(), trainer.optimizer.state_dict()

    return gather_weights(trainer.policy, resident), save_sharded(store, key, trainer.optimizer)
