"""Advantage-weighted flow matching for GRPO groups (the DiffusionNFT objective).

Flow-GRPO scores a rollout by the log-probs of its SDE steps. This objective scores
it with the loss the model was pretrained with instead: for each generated image x0,
draw a noise level sigma and eps, form x_sigma = (1 - sigma) x0 + sigma eps and regress
the velocity towards eps - x0, through two implicit policies built from the current
velocity v and the frozen sampling policy's v_old (Zheng et al., "DiffusionNFT", 2025):

    v_pos = (1 - beta) v_old + beta v          (pulled towards good samples)
    v_neg = (1 + beta) v_old - beta v          (pulled towards bad samples)
    loss  = r ||v_pos - u||^2 + (1 - r) ||v_neg - u||^2,   u = eps - x0

with r in [0, 1] the sample's "optimality" from its group advantage. At v = v_old the
gradient is 2 beta (2r - 1)(v_old - u): an advantage-weighted flow-matching step. As v
leaves v_old the two terms pull it back (a built-in trust region), so a group whose
rewards all tie (r = 0.5) only anchors the policy to v_old.

Why here: the gradient has the variance of supervised flow matching, not of a
per-step likelihood ratio, and the rollout can use any sampler, including the
deterministic ODE that validation uses (docs/RECIPE.md).

Example:
    r_N = optimality(adv_N, scale=2.0)
    loss, stats = nft_loss(v_N3HW, v_old_N3HW, target_N3HW, r_N, beta=1.0)
"""

from __future__ import annotations

from typing import Iterator

import torch


def optimality(adv_N: torch.Tensor, scale: float) -> torch.Tensor:
    """Map group advantages to r in [0, 1]: 0.5 + 0.5 clip(adv / scale, -1, 1)."""
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    return 0.5 + 0.5 * (adv_N / scale).clamp(-1.0, 1.0)


def noise_levels(
    shape: tuple[int, ...], num_levels: int, sigma_range: tuple[float, float], antithetic: bool, gen: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(sigma_N, eps) for each of `num_levels` noise levels of a batch of images of `shape` (N, ...): sigma
    uniform in sigma_range per sample. Antithetic: every odd level reuses the previous sigma with -eps, so a
    pair's noise cancels in the mean. Draws lazily from `gen`, in level order."""
    lo, hi = sigma_range
    sigma = eps = None
    for k in range(num_levels):
        if antithetic and k % 2 == 1:
            eps = -eps
        else:
            sigma = lo + (hi - lo) * torch.rand(shape[0], generator=gen)
            eps = torch.randn(shape, generator=gen)
        yield sigma, eps


def noisy_sample(
    x0_N3HW: torch.Tensor, sigma_N: torch.Tensor, eps_N3HW: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The flow-matching pair at noise level sigma: (x_sigma, velocity target eps - x0)."""
    s = sigma_N.view(-1, *([1] * (x0_N3HW.dim() - 1)))
    return (1 - s) * x0_N3HW + s * eps_N3HW, eps_N3HW - x0_N3HW


WEIGHTINGS = ("velocity", "adaptive")


def _matching_error(
    v_N3HW: torch.Tensor, target_N3HW: torch.Tensor, sigma_N: torch.Tensor | None, weighting: str
) -> torch.Tensor:
    """Per-sample matching error of a velocity against the flow-matching target.

    "velocity": mean squared velocity error. "adaptive" (DiffusionNFT's released code):
    the squared error of the implied clean image x0 = x_sigma - sigma v, which is
    sigma (target - v), divided by its own mean absolute value (a constant), so every
    sample and noise level contributes a step of similar size whatever its error scale.
    """
    dims = tuple(range(1, v_N3HW.dim()))
    if weighting == "velocity":
        return ((v_N3HW - target_N3HW) ** 2).mean(dim=dims)
    err = sigma_N.view(-1, *([1] * len(dims))) * (target_N3HW - v_N3HW)
    scale = err.detach().abs().mean(dim=dims).clamp_min(1e-5)
    return (err**2).mean(dim=dims) / scale


def nft_loss(
    v_N3HW: torch.Tensor,
    v_old_N3HW: torch.Tensor,
    target_N3HW: torch.Tensor,
    r_N: torch.Tensor,
    beta: float,
    sigma_N: torch.Tensor | None = None,
    weighting: str = "velocity",
) -> tuple[torch.Tensor, dict[str, float]]:
    """The NFT loss, mean over the batch; v_old and target are constants. All fp32.

    weighting "adaptive" needs the noise level sigma_N of each sample (see _matching_error).
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if weighting == "adaptive" and sigma_N is None:
        raise ValueError("weighting 'adaptive' needs sigma_N, the noise level of each sample")
    v_old = v_old_N3HW.detach()
    v_pos = (1 - beta) * v_old + beta * v_N3HW
    v_neg = (1 + beta) * v_old - beta * v_N3HW
    pos = _matching_error(v_pos, target_N3HW, sigma_N, weighting)
    neg = _matching_error(v_neg, target_N3HW, sigma_N, weighting)
    loss = (r_N * pos + (1 - r_N) * neg).mean()
    with torch.no_grad():
        stats = {
            "fm_loss": float(((v_N3HW - target_N3HW) ** 2).mean()),
            "drift": float(((v_N3HW - v_old) ** 2).mean()),
        }
    return loss, stats
