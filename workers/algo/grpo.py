"""GRPO maths for flow-matching policies: group advantages, the clipped loss, the KL term.

Pure torch, no I/O. Shapes in the docstrings; N = samples in the batch.

Example:
    adv_N = group_advantages(rewards_N, group_ids_N, clip=5.0)
    loss, stats = clipped_policy_loss(log_prob_N, old_log_prob_N, adv_N, clip_range=1e-4)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.algo.nft import WEIGHTINGS

OBJECTIVES = ("flow_grpo", "nft")
LR_SCHEDULES = ("constant", "cosine")
ADV_NORMS = ("group", "batch", "global_std")
ADVANTAGES = ("total", "per-component")
KL_FORMS = ("step", "flow_grpo")


@dataclass(frozen=True)
class GRPOConfig:
    lr: float = 5e-5
    """AdamW learning rate on the FP32 master weights (RL range 1e-6 .. 1e-4; see docs/RECIPE.md)."""
    clip_range: float = 1e-4
    """PPO ratio clip (Flow-GRPO: log-probs are means over 3k dims, so ratios stay near 1)."""
    adv_clip: float = 5.0
    """Advantages are clipped to [-adv_clip, adv_clip]."""
    adv_norm: str = "group"
    """What divides a sample's deviation from its group mean: "group" (that group's std,
    Flow-GRPO's per-group default), "batch" (the root mean square of the deviations from the group means; see
    group_advantages; no held-out gain on MiniGenEval, docs/RECIPE.md, run BN) or "global_std" (the std of every
    reward of the batch around the batch mean: flow_grpo's `sample.global_std`)."""
    advantage: str = "total"
    """What the advantages normalise: "total" (the reward, a multi-reward's weighted sum) or "per-component"
    (each component of a `multi:` reward normalised within its group, then weighted: `component_advantages`), so a
    component with a small spread is not drowned by one with a large spread."""
    kl_beta: float = 0.0
    """Weight of the KL to the reference (base) policy; 0 skips the reference forward.
    flow_grpo: on the SDE step means (Flow-GRPO); nft: the squared velocity difference
    to the reference at the same noisy sample (v-space, as DiffusionNFT's trainers do)."""
    kl_form: str = "step"
    """flow_grpo objective: the KL term's denominator (`kl_to_reference`). "step": the Gaussian KL of one SDE step,
    ||mu - mu_ref||^2 / (2 std^2 |dt|); "flow_grpo": flow_grpo's train_sd3.py, ||mu - mu_ref||^2 / (2 std^2), i.e.
    |dt| times "step" (about 1/10 at 10 steps), the form its published kl_beta (0.04) was tuned with."""
    num_epochs: int = 1
    """Passes over each iteration's rollouts."""
    num_minibatches: int = 2
    """Optimizer steps per epoch; gradients accumulate over the SDE steps of a minibatch."""
    max_grad_norm: float = 1.0
    lr_warmup_steps: int = 0
    """Optimizer steps over which the learning rate ramps linearly up to lr (0 = none). AdamW's
    first bias-corrected steps move every weight by about lr whatever the gradient's signal;
    a ramp keeps them from undoing what the base does right (docs/RECIPE.md)."""
    lr_schedule: str = "constant"
    """After the warm-up: "constant", or "cosine" (decays towards 0 at the run's last optimizer
    step, TrainConfig.iterations x num_epochs x num_minibatches). On MiniGenEval a cosine decay
    from lr 2e-4 did not beat a constant 1e-4 (docs/RECIPE.md, run C2)."""
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    objective: str = "flow_grpo"
    """"flow_grpo": PPO-clip on the SDE steps' log-probs (needs noise_level > 0).
    "nft": advantage-weighted flow matching (workers/algo/nft.py; any sampler, including the ODE)."""
    nft_beta: float = 1.0
    """NFT: how far the implicit positive/negative policies step from the sampling policy."""
    nft_timesteps: int = 2
    """NFT: noise levels drawn per sample and update (more = lower-variance gradient, more compute)."""
    nft_adv_scale: float = 2.0
    """NFT: an advantage of +-nft_adv_scale maps to optimality 1 / 0."""
    nft_weighting: str = "velocity"
    """NFT: "velocity" (squared velocity error) or "adaptive" (x0 error over its own mean
    magnitude, DiffusionNFT's released loss); see workers/algo/nft.py."""
    nft_antithetic: bool = False
    """NFT: draw the noise levels in pairs that share sigma, one with eps and one with -eps, so
    the part of the gradient that is odd in eps cancels within a pair (an odd nft_timesteps
    leaves the last level unpaired). It raised the gradient's signal share but gave no
    held-out gain on MiniGenEval (docs/RECIPE.md, run P4AH)."""
    nft_sigma_range: tuple[float, float] = (0.0, 1.0)
    """NFT: noise levels are drawn uniformly from [low, high] within [0, 1]; a low above 0 skips
    the fine-detail end of the flow (docs/RECIPE.md, run P4AH)."""

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.nft_weighting not in WEIGHTINGS:
            raise ValueError(f"nft_weighting must be one of {WEIGHTINGS}, got {self.nft_weighting!r}")
        if not 0 < self.nft_beta <= 10 or self.nft_timesteps < 1 or self.nft_adv_scale <= 0:
            raise ValueError(
                f"nft_beta must be in (0, 10], nft_timesteps >= 1, nft_adv_scale > 0; got "
                f"{self.nft_beta}, {self.nft_timesteps}, {self.nft_adv_scale}"
            )
        if not 0 < self.lr <= 1e-2:
            raise ValueError(f"lr must be in (0, 1e-2], got {self.lr} (RL learning rates are 1e-6 .. 1e-4)")
        if self.clip_range <= 0:
            raise ValueError(f"clip_range must be > 0, got {self.clip_range}")
        if self.adv_clip <= 0:
            raise ValueError(f"adv_clip must be > 0, got {self.adv_clip}")
        if self.kl_beta < 0:
            raise ValueError(f"kl_beta must be >= 0, got {self.kl_beta}")
        if self.kl_form not in KL_FORMS:
            raise ValueError(f"kl_form must be one of {KL_FORMS}, got {self.kl_form!r}")
        if self.num_epochs < 1 or self.num_minibatches < 1:
            raise ValueError(
                f"num_epochs and num_minibatches must be >= 1, got {self.num_epochs}, {self.num_minibatches}"
            )
        if self.adv_norm not in ADV_NORMS:
            raise ValueError(f"adv_norm must be one of {ADV_NORMS}, got {self.adv_norm!r}")
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"advantage must be one of {ADVANTAGES}, got {self.advantage!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        lo, hi = self.nft_sigma_range
        if not 0 <= lo < hi <= 1:
            raise ValueError(f"nft_sigma_range must satisfy 0 <= low < high <= 1, got {self.nft_sigma_range}")
        if self.lr_warmup_steps < 0:
            raise ValueError(f"lr_warmup_steps must be >= 0, got {self.lr_warmup_steps}")
        if self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0, got {self.max_grad_norm}")

    def advantages(self, rewards_N: torch.Tensor, group_ids_N: torch.Tensor) -> torch.Tensor:
        """group_advantages with this config's clip and normalisation: what every trainer path uses."""
        return group_advantages(rewards_N, group_ids_N, clip=self.adv_clip, norm=self.adv_norm)


def group_advantages(
    rewards_N: torch.Tensor, group_ids_N: torch.Tensor, clip: float = 5.0, eps: float = 1e-4, norm: str = "group"
) -> torch.Tensor:
    """(r - group mean) / (std + eps), clipped; zero for groups whose rewards are all equal.

    norm "group": each group's own std (Flow-GRPO). "batch": one std for the whole batch, the
    root mean square of every sample's deviation from its group mean, so a group whose rewards
    differ by little gets small advantages instead of +-1. "global_std": flow_grpo's global std,
    np.std of every reward of the batch (around the batch mean, ddof 0), as in its
    flow_grpo/stat_tracking.py `PerPromptStatTracker.update` with global_std=True.
    rewards_N: (N,) float; group_ids_N: (N,) int, samples of one prompt share an id.
    """
    return normalised_deviations(rewards_N, group_ids_N, eps, norm).clamp(-clip, clip).float()


def normalised_deviations(
    rewards_N: torch.Tensor, group_ids_N: torch.Tensor, eps: float = 1e-4, norm: str = "group"
) -> torch.Tensor:
    """group_advantages before the clip, in float64: (r - group mean) / (std + eps), the std as `norm` says."""
    if norm not in ADV_NORMS:
        raise ValueError(f"norm must be one of {ADV_NORMS}, got {norm!r}")
    rewards = rewards_N.double()
    _, inv = torch.unique(group_ids_N, return_inverse=True)
    g = int(inv.max()) + 1
    count = torch.zeros(g, dtype=torch.float64).index_add_(0, inv, torch.ones_like(rewards))
    mean = torch.zeros(g, dtype=torch.float64).index_add_(0, inv, rewards) / count
    var = torch.zeros(g, dtype=torch.float64).index_add_(0, inv, (rewards - mean[inv]) ** 2) / count
    dev = rewards - mean[inv]
    if norm == "group":
        return dev / (var.sqrt()[inv] + eps)
    if norm == "global_std":
        return dev / (rewards.std(unbiased=False) + eps)
    return dev / (dev.pow(2).mean().sqrt() + eps)


def group_reward_stats(rewards_N: torch.Tensor, group_ids_N: torch.Tensor) -> dict[str, float]:
    """Flow-GRPO's diagnostics: mean within-group std and the share of zero-std groups."""
    stds = []
    for gid in torch.unique(group_ids_N):
        r = rewards_N[group_ids_N == gid].double()
        stds.append(float(r.std(unbiased=False)))
    return {
        "reward_std": float(sum(stds) / len(stds)),
        "zero_std_ratio": float(sum(s < 1e-8 for s in stds) / len(stds)),
    }


def clipped_policy_loss(
    log_prob_N: torch.Tensor, old_log_prob_N: torch.Tensor, adv_N: torch.Tensor, clip_range: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO-clip loss, mean over the batch. All inputs (N,); old log-probs are constants."""
    ratio = torch.exp(log_prob_N - old_log_prob_N.detach())
    unclipped = -adv_N * ratio
    clipped = -adv_N * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    loss = torch.maximum(unclipped, clipped).mean()
    with torch.no_grad():
        stats = {
            "clip_frac": float(((ratio - 1.0).abs() > clip_range).float().mean()),
            "approx_kl": float(0.5 * ((log_prob_N - old_log_prob_N) ** 2).mean()),
        }
    return loss, stats


def kl_to_reference(
    mean: torch.Tensor, ref_mean: torch.Tensor, std_dev_t: torch.Tensor, dt: torch.Tensor, form: str = "step"
) -> torch.Tensor:
    """KL between the Gaussian SDE steps of the policy and the reference, per sample (N,), averaged over non-batch
    dims (as the log-prob). std_dev_t is Flow-GRPO's sqrt(sigma / (1 - sigma)) * noise_level; dt < 0.

    form "step":      ||mu - mu_ref||^2 / (2 (std sqrt(-dt))^2)   (the step's own variance)
    form "flow_grpo": ||mu - mu_ref||^2 / (2 std^2)                (flow_grpo's train_sd3.py: |dt| times "step")
    """
    if form not in KL_FORMS:
        raise ValueError(f"kl form must be one of {KL_FORMS}, got {form!r}")
    var = (std_dev_t * torch.sqrt(-dt)) ** 2 if form == "step" else std_dev_t**2 + torch.zeros_like(dt)
    kl = (mean - ref_mean.detach()) ** 2 / (2 * var)
    return kl.mean(dim=tuple(range(1, kl.dim())))
