"""How this process trains: alone (the default) or as rank r of N data-parallel ranks, and with or without gradient
checkpointing. `spotlight train --nproc N` starts the ranks (workers/trainer/launch.py); the train phase reads the
setup from here (`current_setup`), so the coordinator's phases keep their signatures.

Rank 0 runs the coordinator: the driver, the ledger, the store's writes, the metrics and validation. The other
ranks compute: each waits for rank 0's next order (`Ranks.receive`), samples its share of an in-process rollout or
joins the FSDP2 update the order names, and waits again; an order of None ends them. Orders travel on a gloo
group of their own (CPU, even beside NCCL), with a long timeout: the other ranks wait there while rank 0
validates and syncs. Orders are plain dataclasses, sent
with torch's `broadcast_object_list` (pickled) between the processes one command started.

Example (in each process the launcher starts):
    ranks = join_ranks("cuda")                      # NCCL for the update, gloo for orders
    with trainer_setup(TrainerSetup(gradient_checkpointing=True, ranks=ranks)):
        if ranks.rank == 0:
            run_the_driver(); ranks.send(None)     # train_iteration sends each update's order
        else:
            while (order := ranks.receive()) is not None: ...
"""

from __future__ import annotations

import datetime
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist

from workers.trainer.fsdp import init_distributed

ORDER_TIMEOUT = datetime.timedelta(hours=24)
"""The longest a rank waits for rank 0's next order (rank 0 samples, validates and syncs meanwhile). A rank 0 that
dies ends the others at once (the launcher stops them); this bounds only a rank 0 that hangs."""


@dataclass(frozen=True)
class Ranks:
    """This process's place among the data-parallel trainer ranks."""

    rank: int
    world_size: int
    mesh: Any
    """The 1-D device mesh FSDP2 shards over (workers/trainer/fsdp.py)."""
    orders: Any
    """The gloo process group rank 0's orders travel on."""

    def __post_init__(self):
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")

    def send(self, order: Any) -> None:
        """Rank 0: every other rank's next order (None: stop)."""
        assert self.rank == 0, "only rank 0 (the coordinator) gives orders"
        dist.broadcast_object_list([order], src=0, group=self.orders)

    def receive(self) -> Any:
        """Ranks 1..N-1: rank 0's next order (None: stop); waits up to ORDER_TIMEOUT."""
        box = [None]
        dist.broadcast_object_list(box, src=0, group=self.orders)
        return box[0]


@dataclass(frozen=True)
class TrainerSetup:
    """How the train phase runs in this process."""

    gradient_checkpointing: bool = False
    """Recompute each transformer block in backward (workers/trainer/memory.py): less activation memory."""
    ranks: Ranks | None = None
    """None: this process trains alone."""


_current = TrainerSetup()


def current_setup() -> TrainerSetup:
    return _current


@contextmanager
def trainer_setup(setup: TrainerSetup) -> Iterator[TrainerSetup]:
    """The train phase runs under `setup` inside the block (the process's default again after it)."""
    global _current
    previous, _current = _current, setup
    try:
        yield setup
    finally:
        _current = previous


def join_ranks(device: str) -> Ranks:
    """Join the ranks the launcher started (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the environment):
    NCCL on "cuda" (rank r on GPU r), gloo on "cpu" (each rank gets its share of the CPU threads)."""
    mesh = init_distributed("cuda" if device.startswith("cuda") else "cpu")
    world_size = dist.get_world_size()
    if mesh.device_type == "cpu":
        torch.set_num_threads(max(1, torch.get_num_threads() // world_size))
    orders = dist.new_group(backend="gloo", timeout=ORDER_TIMEOUT)
    return Ranks(dist.get_rank(), world_size, mesh, orders)


def leave_ranks() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
