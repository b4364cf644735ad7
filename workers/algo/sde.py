"""Flow-matching sampling maths: the sigma schedule, counter-based noise, SDE and ODE steps.

Convention (rectified flow, as SD3 / Qwen-Image): x_sigma = (1 - sigma) x0 + sigma eps,
the model predicts v = eps - x0, and sampling walks sigma from 1 down to 0.

Example:
    sigmas = sigma_schedule(8)
    x = request_noise(seed, 0, shape)                       # initial noise
    prev, log_prob, mean, std = sde_step_with_logprob(v, sigmas[0], sigmas[1], x, 0.7,
                                                       noise=request_noise(seed, 1, shape))
"""

from __future__ import annotations

import hashlib
import math

import torch

_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))


def sigma_schedule(num_steps: int, shift: float = 1.0) -> torch.Tensor:
    """num_steps + 1 noise levels from 1 to 0 (fp64 on CPU), with SD3's timestep shift."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    t = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    return shift * t / (1 + (shift - 1) * t)


def noise_seed(seed: int, counter: int) -> int:
    """A 63-bit generator seed for (request seed, counter), well mixed so nearby seeds are unrelated."""
    digest = hashlib.blake2b(f"{seed}:{counter}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1)


def request_noise(seed: int, counter: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Standard normal noise that depends only on (seed, counter): counter 0 is the initial
    noise, counter t + 1 the noise of SDE step t. Replays and resumes reproduce it exactly."""
    gen = torch.Generator().manual_seed(noise_seed(seed, counter))
    return torch.randn(shape, generator=gen, dtype=torch.float32)


def batch_noise(seeds: list[int], counter: int, shape: tuple[int, ...]) -> torch.Tensor:
    """request_noise for each seed, stacked: (len(seeds), *shape)."""
    return torch.stack([request_noise(s, counter, shape) for s in seeds])


def _per_sample(value, like: torch.Tensor) -> torch.Tensor:
    """A scalar or (N,) sigma as an fp32 tensor broadcastable against (N, ...)."""
    t = torch.as_tensor(value, dtype=torch.float32, device=like.device)
    return t.reshape(-1, *([1] * (like.dim() - 1))) if t.dim() else t


def sde_step_with_logprob(
    model_output: torch.Tensor,
    sigma,
    sigma_next,
    sample: torch.Tensor,
    noise_level: float,
    prev_sample: torch.Tensor | None = None,
    noise: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One Flow-GRPO SDE step from sigma to sigma_next, with the log-prob of its result.

    Shapes: model_output, sample, prev_sample, noise (N, ...); sigma, sigma_next scalars or (N,).
    Returns prev_sample (N, ...), log_prob (N,) averaged over non-batch dims,
    prev_sample_mean (N, ...) and std_dev_t (broadcastable, N x 1 ...).
    Everything is computed in fp32: bf16 overflows in the log-prob.
    """
    v = model_output.float()
    x = sample.float()
    sigma_t = _per_sample(sigma, x)
    sigma_n = _per_sample(sigma_next, x)
    # At sigma = 1 the factor sigma / (1 - sigma) is infinite; Flow-GRPO puts the next
    # sigma (sigmas[1]) in the denominator there, otherwise std explodes (sigma=0.999 -> 22).
    denom_sigma = torch.where(sigma_t >= 1.0, sigma_n, sigma_t)
    std_dev_t = torch.sqrt(sigma_t / (1 - denom_sigma)) * noise_level
    dt = sigma_n - sigma_t  # negative
    mean = x * (1 + std_dev_t**2 / (2 * sigma_t) * dt) + v * (1 + std_dev_t**2 * (1 - sigma_t) / (2 * sigma_t)) * dt
    scale = std_dev_t * torch.sqrt(-dt)
    if prev_sample is None:
        if noise is None:
            raise ValueError("pass noise (from request_noise) or prev_sample: the step never draws global-RNG noise")
        prev_sample = mean + scale * noise.float()
    prev = prev_sample.float()
    log_prob = -((prev.detach() - mean) ** 2) / (2 * scale**2) - torch.log(scale) - _LOG_SQRT_2PI
    log_prob = log_prob.mean(dim=tuple(range(1, log_prob.dim())))
    return prev, log_prob, mean, std_dev_t


def ode_step(model_output: torch.Tensor, sigma, sigma_next, sample: torch.Tensor) -> torch.Tensor:
    """Deterministic Euler step of the probability-flow ODE (used for validation)."""
    x = sample.float()
    return x + (_per_sample(sigma_next, x) - _per_sample(sigma, x)) * model_output.float()
