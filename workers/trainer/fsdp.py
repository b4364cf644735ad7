"""FSDP2 data parallelism for the GRPO trainer: the policy sharded over N processes, each taking its slice of
every minibatch, so that N ranks take the optimizer steps one process would.

`fully_shard` (torch.distributed.fsdp, FSDP2) wraps each transformer block, then each of the policy's top-level
modules (the transformer's root; the pixel policy's text encoder), so parameters, gradients and AdamW's state live
as DTensor shards: a 20B transformer's full weights exist on a rank one block at a time. gloo on CPU, NCCL on GPU.

What keeps N ranks equal to one process (tests/workers/trainer/test_fsdp.py checks it):
- every rank draws the same minibatch partition from the trainer's seeded generator, and NFT's noise for the
  whole minibatch, then takes its contiguous part (`DataShard.part`), so generators stay in step across ranks;
- a rank's loss is its part's mean times its share of the minibatch, and FSDP sums (not averages) the gradients,
  so the reduced gradient is the whole minibatch's mean;
- every rank gets at least one sample of every minibatch, so all run the same forwards, backwards and
  collectives; `clip_grad_norm_` reduces the norm over the DTensor shards, so every rank clips alike;
- the logged stats are shares summed over ranks: the single process's minibatch means.

Example (one process per GPU, under `torchrun --nproc-per-node N`):
    mesh = init_distributed("cuda")
    trainer = GRPOTrainer(policy, config)                   # builds v_old / the reference from the full policy
    distribute(trainer, mesh, FSDPConfig(mixed_precision=True))
    stats = trainer.update(batch)                           # the same batch on every rank
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from workers.trainer.frozen import shares_transformer
from workers.trainer.sharded_load import is_empty, materialise

BLOCK_LISTS = ("transformer_blocks", "single_transformer_blocks")
"""The diffusers transformers' ModuleLists of blocks (Qwen-Image and SD3: the first; FLUX.1: both)."""


@dataclass(frozen=True)
class FSDPConfig:
    mixed_precision: bool = False
    """bf16 parameters in forward and backward, gradients reduced in fp32 (for GPUs, with the sampler's bf16
    autocast); the sharded masters keep their own dtype. Matmuls round as under autocast alone, but norms'
    and biases' weights are bf16 too, so log-probs differ from a worker's by bf16 rounding (see
    recompute_old_log_probs). False gathers the parameters in their own dtype (what the CPU tests use)."""
    reshard_after_forward: bool = True
    """Free a block's gathered weights after its forward and gather them again in backward: less memory, one
    more all-gather per block."""


def init_distributed(
    device_type: str = "cuda", init_method: str = "env://", rank: int | None = None, world_size: int | None = None
):
    """Join the process group (NCCL for "cuda", gloo for "cpu") and return a 1-D device mesh over it.

    Under torchrun the defaults read RANK, WORLD_SIZE and LOCAL_RANK from the environment; each process then
    uses GPU LOCAL_RANK. Tests pass a file:// init_method with an explicit rank and world_size.
    """
    from torch.distributed.device_mesh import init_device_mesh

    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"device_type must be 'cuda' (NCCL) or 'cpu' (gloo), got {device_type!r}")
    if device_type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device_type 'cuda' but no CUDA device is visible; use 'cpu' (gloo)")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank or 0)))
    if not dist.is_initialized():
        kwargs = {} if rank is None else {"rank": rank, "world_size": world_size}
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo", init_method=init_method, **kwargs)
    return init_device_mesh(device_type, (dist.get_world_size(),))


def transformer_blocks(transformer: nn.Module) -> list[nn.Module]:
    """The transformer's blocks, in order (the units FSDP gathers one at a time)."""
    blocks = [b for name in BLOCK_LISTS for b in getattr(transformer, name, [])]
    if not blocks:
        raise ValueError(f"{type(transformer).__name__} has none of {BLOCK_LISTS}: no blocks to shard one at a time")
    return blocks


def shard_policy(policy: nn.Module, mesh, config: FSDPConfig = FSDPConfig()) -> nn.Module:
    """fully_shard each transformer block, then each top-level module of the policy, in place.

    Works for full fine-tuning and for a LoRA (frozen base and trainable adapter share each block's unit; only
    the adapter gets gradients). A GPU mesh moves the policy to this rank's device first: the text encoders and
    the VAE stay whole there, the transformer is sharded.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if mesh.device_type == "cuda" and not any(p.is_meta for p in policy.parameters()):  # empty: materialise() allocates
        policy.to(torch.device("cuda", torch.cuda.current_device()))
    # cast_forward_inputs=False: sigma and the latents stay fp32 into the transformer, as under autocast alone (a
    # bf16 sigma would shift the timestep embedding away from the rollout workers' and bias the PPO ratio).
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)
        if config.mixed_precision
        else MixedPrecisionPolicy()
    )
    kwargs = {"mesh": mesh, "mp_policy": mp, "reshard_after_forward": config.reshard_after_forward}
    for block in transformer_blocks(policy.transformer):
        fully_shard(block, **kwargs)
    for child in policy.children():  # the transformer's root (embeddings, final norm, projections), a text encoder
        if any(True for _ in child.parameters()):
            fully_shard(child, **kwargs)
    _sum_gradients(policy)
    return policy


def _sum_gradients(policy: nn.Module) -> None:
    """Reduce-scatter sums instead of averaging: each rank's loss already carries its share of the minibatch.
    A plain SUM (no NCCL PreMulSum, which gloo lacks), and no division after it."""
    from torch.distributed.fsdp import FSDPModule

    for module in policy.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)


@dataclass(frozen=True)
class DataShard:
    """This rank's part of every minibatch."""

    rank: int
    world_size: int
    device: torch.device
    """Where the stats' all-reduce runs (the CPU for gloo, this rank's GPU for NCCL)."""
    group: object = None
    """The process group (None = the default one)."""
    replicated: bool = False
    """True: every rank holds the whole trained parameters (a LoRA on a whole base, `replicate`), so the
    gradients are summed here (`reduce_gradients`); False: FSDP2's reduce-scatter sums them."""

    def __post_init__(self):
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")

    def part(self, minibatch_size: int) -> tuple[slice, float]:
        """(positions of this rank's samples within the minibatch, their share of it). Contiguous parts in rank
        order; sizes differ by at most one (as torch.tensor_split's)."""
        if minibatch_size < self.world_size:
            raise ValueError(
                f"a minibatch of {minibatch_size} samples cannot be split over {self.world_size} ranks: "
                "every rank needs a sample of every minibatch (fewer grpo.num_minibatches, "
                "more samples per iteration, or fewer processes)"
            )
        base, extra = divmod(minibatch_size, self.world_size)
        start = self.rank * base + min(self.rank, extra)
        size = base + (self.rank < extra)
        return slice(start, start + size), size / minibatch_size

    def micro_count(self, minibatch_size: int, micro_batch: int | None) -> int:
        """Micro-batches of the largest rank part of a minibatch: the count every rank runs (see `micro_parts`)."""
        largest = -(-minibatch_size // self.world_size)
        return -(-largest // micro_batch) if micro_batch else 1

    def sum_over_ranks(self, stats: dict[str, float], share: float) -> dict[str, float]:
        """Each rank's minibatch means weighted by its share, summed over ranks: the whole minibatch's means."""
        keys = sorted(stats)
        values = torch.tensor([stats[k] * share for k in keys], dtype=torch.float64, device=self.device)
        dist.all_reduce(values, group=self.group)
        return dict(zip(keys, values.tolist(), strict=False))

    def reduce_gradients(self, parameters) -> None:
        """A replicated rank's gradients summed over the ranks, in place (one flat all-reduce): every rank then
        holds the whole minibatch's gradient, as FSDP2's reduce-scatter gives each its shard of it."""
        if not self.replicated:
            return
        grads = [p.grad for p in parameters if p.grad is not None]
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads]).to(self.device)
        dist.all_reduce(flat, group=self.group)
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()

    def gather_columns(self, values_SN: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
        """`values_SN` with every rank's own `columns` (each column computed by exactly one rank) in place of the
        rest: the ranks' results, exchanged."""
        mine = torch.zeros_like(values_SN)
        mine[:, columns] = values_SN[:, columns]
        computed = torch.zeros(values_SN.shape[1], dtype=values_SN.dtype)
        computed[columns] = 1
        mine, computed = mine.to(self.device), computed.to(self.device)
        dist.all_reduce(mine, group=self.group)
        dist.all_reduce(computed, group=self.group)
        return torch.where(computed.cpu().bool(), mine.cpu(), values_SN)


def full_weights(policy: nn.Module) -> dict[str, torch.Tensor]:
    """`policy.weights()` as whole CPU tensors (what a checkpoint or a PULSE patch holds). A collective under
    FSDP: every rank must call it, in the same order."""
    return {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu() for k, v in policy.weights().items()
    }


def check_batch_split(num_samples: int, num_minibatches: int, world_size: int) -> None:
    """ValueError unless every minibatch torch.chunk makes of num_samples has at least world_size samples."""
    sizes = [len(c) for c in torch.arange(num_samples).chunk(num_minibatches)]
    if min(sizes) < world_size:
        raise ValueError(
            f"{num_samples} samples in {num_minibatches} minibatches (sizes {sizes}) cannot be split "
            f"over {world_size} ranks: every rank needs a sample of every minibatch (fewer "
            "grpo.num_minibatches, more prompts_per_iteration x group_size, or fewer processes)"
        )


def replicate(trainer, mesh):
    """Make a fresh GRPOTrainer's updates data-parallel over `mesh` without sharding: every rank trains its own whole
    policy (under LoRA, the resident base with the adapters on, which every rank holds anyway to sample with), and
    the adapters' gradients are summed over the ranks before clipping (`DataShard.reduce_gradients`). Returns the
    trainer. The adapters are megabytes: sharding them would save little, and sharding the base would take it
    from the sampler."""
    c = trainer.config
    world_size = mesh.size()
    check_batch_split(c.prompts_per_iteration * c.group_size, c.grpo.num_minibatches, world_size)
    device = torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")
    trainer.data_shard = DataShard(mesh.get_local_rank(), world_size, device, mesh.get_group(), replicated=True)
    return trainer


def distribute(trainer, mesh, config: FSDPConfig = FSDPConfig(), from_rank0: bool = False, source=None):
    """Shard a fresh GRPOTrainer's policy (and its NFT v_old and KL reference, which never train; under LoRA they
    are adapter views of the policy's own transformer, sharded with it) over `mesh`, rebuild its optimizer on the
    shards, and make its updates data-parallel. Returns the trainer.

    Call it after constructing the trainer (its copies are made from the whole policy) and before the first
    update: the optimizer is rebuilt, so it must hold no state yet. Every rank then calls `update` on the same
    batch. from_rank0: the ranks built their policies empty (workers/trainer/sharded_load.py); each rank allocates
    its shards and receives them from rank 0's whole weights: a policy's own, or `source`'s (rank 0's resident
    policy, holding the version the trainer starts from) for a policy rank 0 built empty too."""
    if trainer.optimizer.state:
        raise ValueError(
            "distribute() needs a trainer that has not stepped yet (its AdamW state would be lost); "
            "load optimizer state after distributing"
        )
    c = trainer.config
    world_size = mesh.size()
    check_batch_split(c.prompts_per_iteration * c.group_size, c.grpo.num_minibatches, world_size)
    device = torch.device("cuda", torch.cuda.current_device()) if mesh.device_type == "cuda" else torch.device("cpu")
    for policy in (trainer.policy, trainer.sampling_policy, trainer.reference):
        if policy is not None and not shares_transformer(policy, trainer.policy):  # LoRA views: sharded with it
            whole = None
            if from_rank0 and mesh.get_local_rank() == 0:
                whole = (source if source is not None and is_empty(policy) else policy).state_dict()
            shard_policy(policy, mesh, config)
            if from_rank0:
                materialise(policy, device, whole)
    trainer.optimizer = trainer.build_optimizer()
    trainer.data_shard = DataShard(mesh.get_local_rank(), world_size, device, mesh.get_group())
    return trainer


def load_optimizer_state(optimizer: torch.optim.Optimizer, state_dict: dict) -> None:
    """Load a one-process optimizer state dict (every rank holds it whole, as loaded from a checkpoint) into an
    optimizer over FSDP2 shards: each tensor shaped like its parameter is cut as the parameter is, locally.

    Not torch.distributed.checkpoint's set_optimizer_state_dict: it gives every parameter state, also those that
    never had a gradient, so the next checkpoint would hold more than one process's does."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, values in state_dict["state"].items():
        param = params[int(index)]
        state[index] = {
            name: distribute_tensor(v.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
            if isinstance(param, DTensor) and torch.is_tensor(v) and v.shape == param.shape
            else v
            for name, v in values.items()
        }
    optimizer.load_state_dict({**state_dict, "state": state})
