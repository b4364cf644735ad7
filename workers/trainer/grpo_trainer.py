"""The GRPO trainer: rollouts -> rewards -> group advantages -> clipped policy-gradient steps.

FP32 master weights live in the policy and AdamW; forwards run under BF16 autocast
(SamplerConfig.forward_dtype), as on GPUs. Prompts and seeds of iteration k are a pure
function of (run seed, k), so any iteration can be replayed or planned ahead (seed plans).

Example:
    trainer = GRPOTrainer(policy, TrainConfig())
    batch = trainer.collect(iteration=0)        # Rollouts: trajectory, rewards, advantages
    stats = trainer.update(batch)               # one iteration's optimizer steps
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from workers.algo.grpo import GRPOConfig, clipped_policy_loss, group_reward_stats, kl_to_reference
from workers.algo.nft import nft_loss, noise_levels, noisy_sample, optimality
from workers.algo.sampler import Trajectory, autocast_for, sampler_sigmas, step_log_prob
from workers.algo.seeds import candidate_seeds, domain_seed
from workers.algo.selection import select_max_variance
from workers.task.prompt_file import negative_prompts, train_prompts
from workers.task.prompt_row import set_row_negatives
from workers.task.rewards import get_reward
from workers.trainer.advantages import batch_advantages
from workers.trainer.chunks import micro_parts, sample_scored
from workers.trainer.ema_weights import start_ema, step_ema
from workers.trainer.frozen import V_OLD_ADAPTER, frozen_policy, refresh, shares_transformer
from workers.trainer.old_log_probs import first_epoch_minibatches, with_policy_log_probs
from workers.trainer.step_guard import StepGuard
from workers.trainer.train_config import NO_REWARD, TrainConfig, check_reward_chosen

__all__ = ["NO_REWARD", "GRPOTrainer", "Rollouts", "TrainConfig", "check_reward_chosen"]


@dataclass
class Rollouts:
    iteration: int
    trajectory: Trajectory
    rewards: torch.Tensor
    """(N,) float."""
    group_ids: torch.Tensor
    """(N,) int: index of the prompt within the iteration."""
    advantages: torch.Tensor
    """(N,) float."""
    rollout_s: float
    drawn_rewards: torch.Tensor | None = None
    """(samples drawn,) float, prompt-major: every drawn sample's reward when the batch was
    down-sampled (the policy's own reward; `rewards` is the kept, high-contrast part); else None."""
    images: np.ndarray | None = None
    """(N, H, W, 3) uint8: the decoded images the rewards scored (None for a batch rebuilt from the store)."""
    reward_components: dict[str, np.ndarray] | None = None
    """Each component's (samples drawn,) raw values, prompt-major, for a reward with components (a multi-reward)."""


def default_seeds(config: TrainConfig, iteration: int) -> list[list[int]]:
    """Each prompt's default (unexplored) seeds: rollouts_per_prompt of them, or group_size when unset.
    The first group_size are the request seeds, so a wider draw contains the narrow one."""
    drawn = config.rollouts_per_prompt or config.group_size
    return [
        candidate_seeds(config.seed, iteration, i, config.group_size, drawn)
        for i in range(config.prompts_per_iteration)
    ]


def keep_max_variance(batch: Rollouts, group_size: int, grpo: GRPOConfig, reward: str = "") -> Rollouts:
    """Per prompt, the group_size samples of largest reward variance (`workers.explore.request.select_max_variance`:
    the k lowest plus the group_size - k highest rewards); groups of group_size or fewer stay whole.
    Advantages are recomputed on what is kept; drawn_rewards keeps every drawn sample's reward.
    Returns `batch` itself when no group is larger than group_size."""
    ids = batch.group_ids.tolist()
    members: dict[int, list[int]] = {}
    for n, g in enumerate(ids):
        members.setdefault(g, []).append(n)
    if all(len(m) <= group_size for m in members.values()):
        return batch
    keep = []
    for g in sorted(members):
        rows = members[g]
        keep += (
            rows
            if len(rows) <= group_size
            else select_max_variance(rows, [float(batch.rewards[n]) for n in rows], group_size)
        )
    idx = torch.tensor(keep)
    traj = batch.trajectory
    kept = Trajectory(
        [traj.prompts[n] for n in keep],
        [traj.seeds[n] for n in keep],
        traj.latents[:, idx],
        traj.log_probs[:, idx],
        traj.step,
    )
    rewards, group_ids = batch.rewards[idx], batch.group_ids[idx]
    return Rollouts(
        batch.iteration,
        kept,
        rewards,
        group_ids,
        batch_advantages(grpo, reward, rewards, group_ids, batch.reward_components, idx),
        batch.rollout_s,
        batch.rewards if batch.drawn_rewards is None else batch.drawn_rewards,
        None if batch.images is None else batch.images[idx.numpy()],
        batch.reward_components,
    )


def trainable_parameters(policy):
    """What the optimizer holds: a LoRA's parameters only, or the whole policy's."""
    own = getattr(policy, "trainable_parameters", None)
    return own() if callable(own) else policy.parameters()


class GRPOTrainer:
    def __init__(self, policy, config: TrainConfig, reference=None, max_consecutive_skips: int = 3):
        self.policy = policy
        self.config = config
        set_row_negatives(policy, negative_prompts(config.prompts))
        self.step_guard = StepGuard(max_consecutive_skips)
        """Skips optimizer steps whose gradient is non-finite; fails the update after a run of them."""
        self.reward_fn = get_reward(config.reward)
        g = config.grpo
        self.sampling_policy = frozen_policy(policy, V_OLD_ADAPTER) if g.objective == "nft" else None
        """NFT's v_old: the weights the current batch was sampled with (under LoRA, a second adapter on the same
        transformer; workers/trainer/frozen.py)."""
        if self.sampling_policy is not None and shares_transformer(self.sampling_policy, policy):
            refresh(self.sampling_policy, policy)  # an adapter left by an earlier trainer of this policy is stale
        self.reference = None
        """The KL reference (kl_beta > 0): `reference` when given, else under LoRA the base (adapters disabled),
        else a frozen copy of the policy as it is now."""
        if g.kl_beta > 0:
            self.reference = frozen_policy(policy, None) if reference is None else reference.requires_grad_(False)
        self.optimizer = self.build_optimizer()
        self.ema_weights: dict[str, torch.Tensor] | None = None
        """With config.ema: the moving average of `policy.weights()` (FP32; workers/algo/ema.py), restored from the
        checkpoint by the caller or started from the weights at the first update."""
        self.data_shard = None
        """This rank's part of each minibatch under data parallelism (workers/trainer/fsdp.py); None = one process."""

    def build_optimizer(self) -> torch.optim.Optimizer:
        """AdamW over the policy's trainable parameters (built again when FSDP replaces them by shards)."""
        g = self.config.grpo
        return torch.optim.AdamW(
            list(trainable_parameters(self.policy)), lr=g.lr, betas=g.adam_betas, weight_decay=g.weight_decay
        )

    def collect(
        self, iteration: int, seeds: list[int] | list[list[int]] | None = None, keep_all: bool = False
    ) -> Rollouts:
        """Sample the iteration's prompts and score them.

        seeds: the seeds of each prompt (one list per prompt, any number >= 2 each), or a flat
        prompt-major list of group_size per prompt (a seed plan's `flat_seeds()`). Without them,
        each prompt draws rollouts_per_prompt default seeds (group_size when unset). Prompts with
        more than group_size samples keep the group_size of largest reward variance
        (`keep_max_variance`) unless keep_all, which returns every drawn sample (the pipeline
        commits them all and its train phase keeps the high-contrast part).
        """
        c = self.config
        prompts = train_prompts(c, iteration)
        if seeds is None:
            groups = default_seeds(c, iteration)
        elif seeds and isinstance(seeds[0], int):
            if len(seeds) != len(prompts) * c.group_size:
                raise ValueError(f"{len(seeds)} seeds for {len(prompts)} prompts x group_size {c.group_size}")
            groups = [list(seeds[i * c.group_size : (i + 1) * c.group_size]) for i in range(len(prompts))]
        else:
            groups = [list(g) for g in seeds]
            if len(groups) != len(prompts) or any(len(g) < 2 for g in groups):
                raise ValueError(
                    f"{len(groups)} seed groups (sizes {[len(g) for g in groups]}) for {len(prompts)} "
                    "prompts: give one group of at least 2 seeds per prompt"
                )
        all_prompts = [p for p, g in zip(prompts, groups, strict=False) for _ in g]
        t0 = time.perf_counter()
        if self.sampling_policy is not None:
            refresh(self.sampling_policy, self.policy)
        traj, images, rewards, components = sample_scored(
            self.policy,
            self.reward_fn,
            all_prompts,
            [s for g in groups for s in g],
            c.sampler_at(iteration),
            c.rollout_batch,
            c.prompts,
            init_seeds=c.init_seeds(iteration, groups),
        )
        group_ids = torch.arange(len(prompts)).repeat_interleave(torch.tensor([len(g) for g in groups]))
        batch = Rollouts(
            iteration,
            traj,
            rewards,
            group_ids,
            batch_advantages(c.grpo, c.reward, rewards, group_ids, components),
            0.0,
            images=images,
            reward_components=components or None,
        )
        if not keep_all:
            batch = keep_max_variance(batch, c.group_size, c.grpo, c.reward)
        batch.rollout_s = time.perf_counter() - t0
        return batch

    def _minibatch_loss(self, batch: Rollouts, index: torch.Tensor, loss_scale: float = 1.0) -> dict[str, float]:
        """Accumulate gradients of one minibatch over every SDE step; returns its stats. loss_scale: this
        rank's share of the minibatch under data parallelism."""
        c, g = self.config.sampler_at(batch.iteration), self.config.grpo
        traj = batch.trajectory
        prompts = [traj.prompts[i] for i in index.tolist()]
        steps = c.sde_steps
        sigmas = sampler_sigmas(self.policy, c)
        sums = {"loss": 0.0, "clip_frac": 0.0, "approx_kl": 0.0, "kl": 0.0}
        for t in steps:
            emb, mask = self.policy.encode_prompts(prompts)
            lp, mean, std = step_log_prob(self.policy, traj.latents, t, emb, mask, c, index)
            loss, stats = clipped_policy_loss(
                lp, traj.log_probs[t][index].to(lp.device), batch.advantages[index].to(lp.device), g.clip_range
            )
            if self.reference is not None:
                with torch.no_grad():
                    ref_emb, ref_mask = self.reference.encode_prompts(prompts)
                    _, ref_mean, _ = step_log_prob(self.reference, traj.latents, t, ref_emb, ref_mask, c, index)
                kl = kl_to_reference(mean, ref_mean, std, sigmas[t + 1] - sigmas[t], g.kl_form).mean()
                loss = loss + g.kl_beta * kl
                sums["kl"] += kl.item() / len(steps)
            (loss * loss_scale / len(steps)).backward()
            sums["loss"] += loss.item() / len(steps)
            sums["clip_frac"] += stats["clip_frac"] / len(steps)
            sums["approx_kl"] += stats["approx_kl"] / len(steps)
        return sums

    def _nft_minibatch_loss(
        self,
        batch: Rollouts,
        index: torch.Tensor,
        levels: list[tuple[torch.Tensor, torch.Tensor]],
        part: slice = slice(None),
        loss_scale: float = 1.0,
    ) -> dict[str, float]:
        """Accumulate the NFT loss's gradients over nft_timesteps noise levels per sample. levels: (sigma_N, eps)
        of each noise level for the whole minibatch (`_noise_levels`). part, loss_scale: the samples of the
        minibatch computed here (this rank's, or one micro-batch of them) and their share of it."""
        g, c = self.config.grpo, self.config.sampler
        index = index[part]
        x0 = batch.trajectory.images[index]
        prompts = [batch.trajectory.prompts[i] for i in index.tolist()]
        r = optimality(batch.advantages[index], g.nft_adv_scale)
        device = next(self.policy.parameters()).device
        sums = {"loss": 0.0, "fm_loss": 0.0, "drift": 0.0, "kl": 0.0}
        for sigma, eps in levels:
            sigma, eps = sigma[part], eps[part]
            x, target = noisy_sample(x0, sigma, eps)
            with autocast_for(c, device):
                emb, mask = self.policy.encode_prompts(prompts)
                v = self.policy.velocity(x.to(device), sigma.to(device), emb, mask)
                with torch.no_grad():
                    old_emb, old_mask = self.sampling_policy.encode_prompts(prompts)
                    v_old = self.sampling_policy.velocity(x.to(device), sigma.to(device), old_emb, old_mask)
                    if self.reference is not None:
                        ref_emb, ref_mask = self.reference.encode_prompts(prompts)
                        v_ref = self.reference.velocity(x.to(device), sigma.to(device), ref_emb, ref_mask)
            loss, stats = nft_loss(
                v.float(), v_old.float(), target.to(device), r.to(device), g.nft_beta, sigma.to(device), g.nft_weighting
            )
            if self.reference is not None:
                kl = ((v.float() - v_ref.float()) ** 2).mean()
                loss = loss + g.kl_beta * kl
                sums["kl"] += kl.item() / g.nft_timesteps
            (loss * loss_scale / g.nft_timesteps).backward()
            sums["loss"] += loss.item() / g.nft_timesteps
            for k in ("fm_loss", "drift"):
                sums[k] += stats[k] / g.nft_timesteps
        return sums

    def update(self, batch: Rollouts, recompute_old_log_probs: bool = False) -> dict[str, float]:
        """GRPO epochs over the batch; returns mean loss / clip / KL stats (over the steps taken), the
        train time, and how many steps a non-finite gradient skipped. recompute_old_log_probs: the PPO
        ratio's denominator from this policy before the first step (workers/trainer/old_log_probs.py)."""
        g = self.config.grpo
        t0 = time.perf_counter()
        self.policy.train()
        self.step_guard.reset()
        n = batch.rewards.shape[0]
        gen = torch.Generator().manual_seed(domain_seed(self.config.seed, "minibatches", batch.iteration))
        start_ema(self)
        if recompute_old_log_probs and g.objective != "nft":
            batch = self._recompute_old_log_probs(batch, gen)
        totals: dict[str, float] = {}
        num_steps = 0
        for _ in range(g.num_epochs):
            for index in torch.randperm(n, generator=gen).chunk(g.num_minibatches):
                self.optimizer.zero_grad(set_to_none=True)
                part, share = (slice(None), 1.0) if self.data_shard is None else self.data_shard.part(len(index))
                stats = self._accumulate(batch, index, gen, part, share)
                if self.data_shard is not None:
                    self.data_shard.reduce_gradients(trainable_parameters(self.policy))
                    stats = self.data_shard.sum_over_ranks(stats, share)
                stats["grad_norm"] = float(
                    torch.nn.utils.clip_grad_norm_(list(trainable_parameters(self.policy)), g.max_grad_norm)
                )
                stats["learning_rate"] = self._set_learning_rate()
                if not self.step_guard.allows(stats["grad_norm"], batch.iteration):
                    self.optimizer.zero_grad(set_to_none=True)  # NaN/inf never reaches the weights or AdamW
                    continue
                self.optimizer.step()
                num_steps += 1
                step_ema(self)
                for k, v in stats.items():
                    totals[k] = totals.get(k, 0.0) + v
        self.policy.eval()
        out = {k: v / max(1, num_steps) for k, v in totals.items()}
        out["train_s"] = time.perf_counter() - t0
        out["optimizer_steps"] = num_steps
        out["skipped_steps"] = self.step_guard.skipped_steps
        return out

    def _recompute_old_log_probs(self, batch: Rollouts, gen: torch.Generator) -> Rollouts:
        """`batch` with its old log-probs from this policy, computed micro-batch by micro-batch as the first epoch
        will compute them. Under data parallelism each rank computes only its part of each minibatch and the ranks
        exchange the results (a later epoch's minibatches mix the parts)."""
        own = []
        for index in first_epoch_minibatches(gen, batch.rewards.shape[0], self.config.grpo.num_minibatches):
            part = slice(None) if self.data_shard is None else self.data_shard.part(len(index))[0]
            own += [index[micro] for micro, _ in self._micro_parts(part, len(index))]
        batch = with_policy_log_probs(self.policy, batch, self.config.sampler_at(batch.iteration), own)
        if self.data_shard is None:
            return batch
        traj = batch.trajectory
        log_probs = self.data_shard.gather_columns(traj.log_probs, torch.cat(own))
        return dataclasses.replace(batch, trajectory=dataclasses.replace(traj, log_probs=log_probs))

    def _accumulate(
        self, batch: Rollouts, index: torch.Tensor, gen: torch.Generator, part: slice, share: float
    ) -> dict[str, float]:
        """Gradients of this process's `part` of one minibatch, one micro-batch (TrainConfig.micro_batch) at a time,
        each weighted by its share of the minibatch; returns the part's mean stats. NFT's noise is drawn for the
        whole minibatch first, so every rank and every micro-batch split draws the same noise."""
        g = self.config.grpo
        levels = self._noise_levels(batch, index, gen) if g.objective == "nft" else None
        total: dict[str, float] = {}
        for micro, micro_share in self._micro_parts(part, len(index)):
            if g.objective == "nft":
                stats = self._nft_minibatch_loss(batch, index, levels, micro, micro_share)
            else:
                stats = self._minibatch_loss(batch, index[micro], micro_share)
            for k, v in stats.items():
                total[k] = total.get(k, 0.0) + v * micro_share / share
        return total

    def _micro_parts(self, part: slice, minibatch_size: int) -> list[tuple[slice, float]]:
        """This process's micro-batches of a minibatch; under data parallelism padded to the count of the rank with
        the largest part, so every rank joins the same number of FSDP collectives."""
        count = (
            None if self.data_shard is None else self.data_shard.micro_count(minibatch_size, self.config.micro_batch)
        )
        return micro_parts(part, minibatch_size, self.config.micro_batch, count)

    def _noise_levels(self, batch: Rollouts, index: torch.Tensor, gen: torch.Generator) -> list:
        """NFT's (sigma_N, eps) per noise level for the minibatch `index`, drawn from `gen` in level order."""
        g = self.config.grpo
        shape = tuple(batch.trajectory.images[index].shape)
        return list(noise_levels(shape, g.nft_timesteps, g.nft_sigma_range, g.nft_antithetic, gen))

    def _set_learning_rate(self) -> float:
        """Warm-up ramp, then the schedule, keyed on AdamW's own step count (restored with its state on resume)."""
        g = self.config.grpo
        done = self.steps_done()
        lr = g.lr * min(1.0, (done + 1) / g.lr_warmup_steps) if g.lr_warmup_steps else g.lr
        if g.lr_schedule == "cosine" and done >= g.lr_warmup_steps:
            total = self.config.iterations * g.num_epochs * g.num_minibatches
            frac = min(1.0, (done - g.lr_warmup_steps) / max(1, total - g.lr_warmup_steps))
            lr *= 0.5 * (1.0 + math.cos(math.pi * frac))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def steps_done(self) -> int:
        """Optimizer steps taken over the run: AdamW's own count (restored with its state on resume)."""
        first = next(iter(self.optimizer.state.values()), None)
        return int(first["step"]) if first is not None else 0

    def batch_stats(self, batch: Rollouts) -> dict[str, float]:
        """reward_mean: over every drawn sample (the policy's reward); the group figures are over the kept ones."""
        stats = group_reward_stats(batch.rewards, batch.group_ids)
        drawn = batch.drawn_rewards if batch.drawn_rewards is not None else batch.rewards
        stats["reward_mean"] = float(drawn.mean())
        stats["rollout_s"] = batch.rollout_s
        for name, values in (batch.reward_components or {}).items():
            stats[f"reward/{name}"] = float(np.mean(values))  # over every drawn sample, like reward_mean
        return stats
