"""Deterministic rollouts: SDE sampling with per-step log-probs, resumable from any step.

A request is (prompt, seed) on given weights with a SamplerConfig. Its initial noise and
every SDE step's noise come from request_noise(seed, counter), so sampling the same
batch again, or resuming it from a saved SamplerState, gives a bit-identical result.

Example:
    cfg = SamplerConfig(num_steps=8, noise_level=0.7)
    traj = rollout(policy, prompts, seeds, cfg)            # traj.images (N, 3, H, W)
    half = rollout(policy, prompts, seeds, cfg, stop_at=4)
    rest = rollout(policy, prompts, seeds, cfg, resume=half.state())  # same images as traj
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from workers.algo.sde import batch_noise, ode_step, sde_step_with_logprob, sigma_schedule


@dataclass(frozen=True)
class SamplerConfig:
    num_steps: int = 8
    """Denoising steps from sigma = 1 to 0."""
    noise_level: float = 0.7
    """Flow-GRPO's eta: scale of the SDE's injected noise (0 = the ODE)."""
    shift: float = 1.0
    """SD3 timestep shift of the sigma schedule (1 = uniform)."""
    sde_window: tuple[int, int] | None = None
    """Steps [start, end) sampled by the SDE (and trained); the rest follow the ODE.
    None = every step (Flow-GRPO); a short window is Flow-GRPO-Fast."""
    forward_dtype: str = "auto"
    """"bf16" (autocast, as on GPUs), "fp32", or "auto": bf16 on CUDA and on CPUs with native
    BF16 (AVX512-BF16 / AMX, where it is ~2x faster), fp32 elsewhere (on AVX2-only CPUs bf16
    is emulated and ~4x slower)."""

    @classmethod
    def from_json(cls, raw: Mapping[str, Any] | None, where: str) -> "SamplerConfig":
        """Parse the JSON form (`dataclasses.asdict`) of a queue payload; ValueError names `where`."""
        fields = dict(raw or {})
        if fields.get("sde_window") is not None:
            fields["sde_window"] = tuple(fields["sde_window"])
        try:
            return cls(**fields)
        except TypeError as err:
            raise ValueError(f"{where}: bad sampler fields: {err}") from err

    def __post_init__(self):
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.noise_level < 0:
            raise ValueError(f"noise_level must be >= 0, got {self.noise_level}")
        if self.shift <= 0:
            raise ValueError(f"shift must be > 0, got {self.shift}")
        if self.forward_dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"forward_dtype must be 'auto', 'bf16' or 'fp32', got {self.forward_dtype!r}")
        if self.sde_window is not None:
            a, b = self.sde_window
            if not 0 <= a < b <= self.num_steps:
                raise ValueError(
                    f"sde_window={self.sde_window} must satisfy 0 <= start < end <= num_steps={self.num_steps}"
                )

    @property
    def sde_steps(self) -> list[int]:
        """Indices of the steps sampled (and trained) with the SDE."""
        if self.noise_level == 0:
            return []
        a, b = self.sde_window or (0, self.num_steps)
        return list(range(a, b))

    def sigmas(self) -> torch.Tensor:
        return sigma_schedule(self.num_steps, self.shift).float()


@dataclass
class SamplerState:
    """What a rollout needs to continue from step `step` (what a worker commits)."""

    step: int
    latents: torch.Tensor
    """x after `step` steps, (N, *sample shape) fp32."""
    log_probs: torch.Tensor
    """(num_steps, N) fp32, filled for SDE steps < step, NaN elsewhere."""


@dataclass
class Trajectory:
    prompts: list[str]
    seeds: list[int]
    latents: torch.Tensor
    """(num_steps + 1, N, *sample shape): x before each step, then the final sample (the image, for the pixel
    policy; VAE latents for a diffusers family: `policy.decode` makes images); steps not yet run are NaN."""
    log_probs: torch.Tensor
    """(num_steps, N): log-prob of each SDE step's sample; NaN for ODE steps."""
    step: int
    """Steps completed."""

    @property
    def images(self) -> torch.Tensor:
        return self.latents[self.step]

    def state(self) -> SamplerState:
        return SamplerState(self.step, self.latents[self.step].clone(), self.log_probs.clone())


@functools.cache
def cpu_has_native_bf16() -> bool:
    """True on x86 CPUs with AVX512-BF16 or AMX-BF16 (read from /proc/cpuinfo; False if unknown)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_forward_dtype(forward_dtype: str, device: torch.device) -> str:
    """ "auto" -> "bf16" where bf16 matmuls are native (CUDA, AVX512-BF16/AMX CPUs), else "fp32"."""
    if forward_dtype != "auto":
        return forward_dtype
    return "bf16" if device.type == "cuda" or cpu_has_native_bf16() else "fp32"


def autocast_for(config: SamplerConfig, device: torch.device):
    if resolve_forward_dtype(config.forward_dtype, device) == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return nullcontext()


def sample_shape(policy) -> tuple[int, ...]:
    """One sample's shape in the space the sampler walks (pixels, or a family's packed VAE latents)."""
    shape = getattr(policy, "latent_shape", None)
    if shape is None:  # a wrapper that only knows the pixel policy's config (the Ulysses SP policy)
        size = policy.config.image_size
        return (3, size, size)
    return tuple(shape)


def sampler_sigmas(policy, config: SamplerConfig) -> torch.Tensor:
    """The noise levels: a diffusers family's own schedule (its scheduler config), else the config's."""
    own = getattr(policy, "sigmas", None)
    return own(config.num_steps, config.shift).float() if callable(own) else config.sigmas()


@torch.no_grad()
def rollout(
    policy,
    prompts: list[str],
    seeds: list[int],
    config: SamplerConfig,
    resume: SamplerState | None = None,
    stop_at: int | None = None,
    init_seeds: list[int] | None = None,
) -> Trajectory:
    """Sample a batch of requests; resume from a SamplerState or stop early at step stop_at. init_seeds: the seed
    of each request's initial noise when it is not its own seed (a group sharing one initial noise:
    sampling.init_same_noise); every SDE step's noise still comes from the request's seed.

    Latents, sigmas and the SDE maths stay on the policy's device for the whole walk; the
    trajectory comes back to the CPU once, at the end. Noise is drawn on the CPU from the
    request's counter-based generator and copied over, so every device samples the same noise;
    the result is bit-identical across runs on one device type (and equal across device types
    only up to their kernels' rounding)."""
    if len(prompts) != len(seeds) or (init_seeds is not None and len(init_seeds) != len(seeds)):
        raise ValueError(f"{len(prompts)} prompts, {len(seeds)} seeds and {len(init_seeds or seeds)} initial seeds")
    n, shape = len(prompts), sample_shape(policy)
    device = next(policy.parameters()).device
    sigmas = sampler_sigmas(policy, config).to(device)
    end = config.num_steps if stop_at is None else stop_at
    latents = torch.full((config.num_steps + 1, n, *shape), float("nan"), device=device)
    log_probs = torch.full((config.num_steps, n), float("nan"), device=device)
    start = 0
    if resume is not None:
        start = resume.step
        latents[start] = resume.latents.to(device)
        log_probs.copy_(resume.log_probs.to(device))
    else:
        latents[0] = batch_noise(seeds if init_seeds is None else init_seeds, 0, shape).to(device)
    emb, mask = policy.encode_prompts(prompts)
    for t in range(start, end):
        latents[t + 1], lp = denoise_step(policy, latents[t], t, seeds, config, (emb, mask), sigmas)
        if lp is not None:
            log_probs[t] = lp
    return Trajectory(list(prompts), list(seeds), latents.cpu(), log_probs.cpu(), end)


@torch.no_grad()
def denoise_step(
    policy, x: torch.Tensor, t: int, seeds: list[int], config: SamplerConfig, cond, sigmas: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Step t of the walk from x (N, *sample shape, on the policy's device): (x after the step, the SDE step's
    log-prob (N,), or None on an ODE step). cond is `policy.encode_prompts(prompts)`; sigmas are
    `sampler_sigmas(policy, config)` on the device. A rollout worker calls it once per step, with the prompt
    encoded once per attempt."""
    device = x.device
    with autocast_for(config, device):
        v = policy.velocity(x, sigmas[t].expand(x.shape[0]), *cond)
    v = v.float()
    if t in config.sde_steps:
        noise = batch_noise(seeds, t + 1, tuple(x.shape[1:])).to(device)
        prev, lp, _, _ = sde_step_with_logprob(v, sigmas[t], sigmas[t + 1], x, config.noise_level, noise=noise)
        return prev, lp
    return ode_step(v, sigmas[t], sigmas[t + 1], x), None


def step_log_prob(
    policy, traj_latents: torch.Tensor, t: int, emb, mask, config: SamplerConfig, index: torch.Tensor | None = None
):
    """Recompute step t's log-prob (with grad) of the stored transition x_t -> x_{t+1}.

    Returns (log_prob (M,), prev_sample_mean, std_dev_t) for the samples in `index` (all if None).
    """
    sigmas = sampler_sigmas(policy, config)
    x = traj_latents[t] if index is None else traj_latents[t][index]
    x_next = traj_latents[t + 1] if index is None else traj_latents[t + 1][index]
    device = next(policy.parameters()).device
    with autocast_for(config, device):
        v = policy.velocity(x.to(device), sigmas[t].expand(x.shape[0]).to(device), emb, mask)
    _, lp, mean, std = sde_step_with_logprob(
        v.float(), sigmas[t], sigmas[t + 1], x.to(device), config.noise_level, prev_sample=x_next.to(device)
    )
    return lp, mean, std
