"""The train phase as one call: trainer state from the store, GRPO update on the iteration's results, new state back.

Example:
    stats = train_iteration(store, "demo", config, 3, requests)   # checkpoint v3 -> v4
"""

from __future__ import annotations

from resources.keys import weights_key
from resources.store import TensorStore
from workers.coordinator.rollout import PlannedRequest, load_batch
from workers.trainer.checkpoint import load_checkpoint, restore_optimizer, save_checkpoint
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig


def train_iteration(store: TensorStore, run: str, config: TrainConfig, iteration: int,
                    requests: list[PlannedRequest], device: str = "cpu") -> dict[str, float]:
    """Update weights version `iteration` into `iteration + 1` on the iteration's committed results;
    returns the batch's reward statistics and the update's loss statistics."""
    policy, optimizer_state = load_checkpoint(store, run, iteration, device)
    # The KL reference is the run's starting policy, as in `spotlight train`.
    reference = load_checkpoint(store, run, 0, device)[0] if config.grpo.kl_beta > 0 else None
    trainer = GRPOTrainer(policy, config, reference=reference)
    restore_optimizer(trainer.optimizer, optimizer_state)
    batch = load_batch(store, run, config, iteration, requests)
    # Old log-probs from the trainer's own forward: the stored ones come from whatever sampled (queue
    # workers run BF16-rounded weights), and with a 1e-4 clip range that alone clips the first minibatch.
    stats = {**trainer.batch_stats(batch), **trainer.update(batch, recompute_old_log_probs=True)}
    stats["checkpoint_bytes"] = save_checkpoint(store, run, iteration + 1, policy, trainer.optimizer)
    if iteration >= 2:
        # Only versions k, k+1 (a redone iteration k needs k) and 0 (the KL reference) stay: FP32
        # weights plus AdamW state are 3x the model, per version. Older weights live on in the PULSE chain.
        store.delete_commit(weights_key(run, iteration - 1))
    return stats
