"""Sequence parallelism inside one rollout group: diffusers' context parallelism (Ulysses) on the policy.

A group of N processes samples one request together. Every rank holds the full weights;
the transformer's context-parallel hooks split the image tokens and the text tokens N
ways, attention exchanges heads with an all-to-all (each rank attends over the whole
sequence for num_heads / N heads) and `proj_out` all-gathers the output. So every rank
ends a denoising step with the same full velocity and takes the same SDE step with the
same counter-based noise: all ranks hold an identical SamplerState, and a request can be
resumed from it at any degree.

Groups re-form without rebuilding the model: `leave_group` removes diffusers' hooks and
destroys the process group, and `join_group` creates a new default process group under a
fresh prefix of a persistent rendezvous store (the node agent's TCPStore), then enables
context parallelism again with a new ContextParallelConfig (diffusers binds the config
to the hooks and attention processors, so the old one must be detached, not mutated).

Constraints (checked by `check_sp_degree`): num_heads and the image token count must be
divisible by the degree; the text is padded with masked tokens to a multiple of it
(masked keys change nothing the image tokens see).

Example:
    store = torch.distributed.TCPStore(host, port, is_master=False)   # the agent's store
    join_group(policy, store, "gen3/g0", rank=r, world_size=2)          # 1 = SP off
    traj = rollout(SequenceParallelPolicy(policy, 2), ["a red circle"], [7], cfg)
    leave_group(policy)
"""

from __future__ import annotations

import datetime
import logging
import time
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

from workers.model.tiny_policy import Policy, PolicyConfig


def check_sp_degree(config: PolicyConfig, degree: int) -> None:
    """Raise ValueError unless a group of `degree` ranks can split this policy's attention."""
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise ValueError(f"SP degree must be an int >= 1, got {degree!r}")
    if config.num_heads % degree:
        raise ValueError(f"SP degree {degree} must divide num_heads={config.num_heads} (Ulysses splits heads)")
    image_tokens = config.tokens_per_side**2
    if image_tokens % degree:
        raise ValueError(f"SP degree {degree} must divide the {image_tokens} image tokens")


def allowed_degrees(config: PolicyConfig, max_degree: int) -> list[int]:
    """SP degrees from 1 to max_degree that this policy supports."""
    out = []
    for d in range(1, max_degree + 1):
        try:
            check_sp_degree(config, d)
        except ValueError:
            continue
        out.append(d)
    return out


def pad_text(emb_BLD: torch.Tensor, mask_BL: torch.Tensor, multiple: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad the text to a length divisible by `multiple` with zero embeddings and False mask."""
    pad = (-emb_BLD.shape[1]) % multiple
    if pad == 0:
        return emb_BLD, mask_BL
    emb = torch.cat([emb_BLD, emb_BLD.new_zeros(emb_BLD.shape[0], pad, emb_BLD.shape[2])], dim=1)
    mask = torch.cat([mask_BL, mask_BL.new_zeros(mask_BL.shape[0], pad)], dim=1)
    return emb, mask


class SequenceParallelPolicy:
    """What `workers.algo.sampler.rollout` needs from a policy, for one rank of an SP group.

    `text` (embeddings, mask) replaces encode_prompts, so a node agent can hand over the
    encodings it keeps; otherwise the prompts are encoded here.
    """

    def __init__(self, policy: Policy, degree: int, text: tuple[torch.Tensor, torch.Tensor] | None = None):
        check_sp_degree(policy.config, degree)
        self.policy = policy
        self.degree = degree
        self.text = text

    @property
    def config(self) -> PolicyConfig:
        return self.policy.config

    def parameters(self):
        return self.policy.parameters()

    def encode_prompts(self, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.text is None:
            emb, mask = self.policy.encode_prompts(prompts)
        else:
            emb, mask = self.text
            if emb.shape[0] != len(prompts):
                raise ValueError(f"text encodings hold {emb.shape[0]} prompts, the request {len(prompts)}")
        return pad_text(emb, mask, self.degree)

    def velocity(self, x_N3HW, sigma_N, emb, mask):
        return self.policy.velocity(x_N3HW, sigma_N, emb, mask)


@dataclass(frozen=True)
class JoinTiming:
    """Where the seconds of a join went (on this rank)."""

    leave_s: float
    """Detaching the previous group: hooks removed, process group destroyed."""
    init_s: float
    """init_process_group through the rendezvous store (0 for a group of one)."""
    enable_s: float
    """enable_parallelism: device mesh and hooks."""


def join_group(
    policy: Policy, store: dist.Store, prefix: str, rank: int, world_size: int, timeout_s: float = 30.0
) -> JoinTiming:
    """Leave any current group, then form group `prefix` as `rank` of `world_size` (1: no group)."""
    check_sp_degree(policy.config, world_size)
    t0 = time.perf_counter()
    leave_group(policy)
    t1 = time.perf_counter()
    init_group(store, prefix, rank, world_size, next(policy.parameters()).device, timeout_s)
    t2 = time.perf_counter()
    if world_size > 1:
        enable_sp(policy, world_size)
    return JoinTiming(t1 - t0, t2 - t1, time.perf_counter() - t2)


def init_group(
    store: dist.Store, prefix: str, rank: int, world_size: int, device: torch.device, timeout_s: float = 30.0
) -> None:
    """The default process group of group `prefix` (NCCL on CUDA, gloo on CPU); nothing for a group of one."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside a group of {world_size}")
    if world_size == 1:
        return
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL binds the group to the current device
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(prefix, store),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def leave_group(policy: Policy | None) -> None:
    """Turn SP off and destroy the process group (also after a member died: gloo allows it)."""
    if policy is not None:
        disable_sp(policy)
    if dist.is_initialized():
        dist.destroy_process_group()


def enable_sp(policy: Policy, degree: int) -> None:
    """Ulysses context parallelism over the current default process group; ValueError for a transformer that
    diffusers gives no context-parallel plan (SD3 in diffusers 0.39)."""
    from diffusers import ContextParallelConfig

    if not dist.is_initialized() or dist.get_world_size() != degree:
        raise ValueError(f"SP degree {degree} needs an initialised process group of that size")
    check_cp_plan(policy.transformer)
    _quiet_diffusers_parallel_notices()
    policy.transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=degree))


def check_cp_plan(transformer) -> None:
    """ValueError unless diffusers can split this transformer's sequence (it has a `_cp_plan`)."""
    import diffusers

    if not getattr(transformer, "_cp_plan", None):
        raise ValueError(
            f"{type(transformer).__name__} has no context-parallel plan (_cp_plan) in diffusers "
            f"{diffusers.__version__}, so it cannot be sampled in Ulysses groups: serve it at SP degree 1 "
            "(or with python -m workers.rollout)"
        )


def disable_sp(policy: Policy) -> None:
    """Remove diffusers' context-parallel hooks and configs: the model runs single-process again."""
    from diffusers.hooks.context_parallel import remove_context_parallel

    transformer = policy.transformer
    if getattr(transformer, "_parallel_config", None) is None:
        return
    remove_context_parallel(transformer, transformer._cp_plan)
    for module in transformer.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "_parallel_config"):
            processor._parallel_config = None
    transformer._parallel_config = None


def sp_degree_of(policy: Policy) -> int:
    """The degree the policy currently runs at (1 when SP is off)."""
    config = getattr(policy.transformer, "_parallel_config", None)
    return 1 if config is None else config.context_parallel_config.ulysses_degree


def _quiet_diffusers_parallel_notices() -> None:
    # enable_parallelism logs an "experimental" warning on every call, and diffusers'
    # gather uses a deprecated functional collective: both are noise once per re-form.
    logging.getLogger("diffusers.models.modeling_utils").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*all_gather_tensor.*", category=FutureWarning)
