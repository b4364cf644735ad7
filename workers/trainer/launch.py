"""N trainer processes on this machine for one command, started by torch's elastic agent (what `torchrun
--standalone --nproc-per-node N` runs): a c10d rendezvous on a free local port, RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT in each process's environment, and no restarts. A rank that fails stops the others, and
the error names it and its traceback.

Example:
    check_nproc(8, "cuda")                          # ValueError before any compute
    result = launch(8, rank_main, arg1, arg2)       # rank_main(arg1, arg2) in 8 processes; rank 0's return value
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

import torch


class RanksFailedError(RuntimeError):
    """A rank of `launch` failed; the others were stopped."""


def check_nproc(nproc: int, device: str) -> None:
    """ValueError (saying what to pass) unless `nproc` processes can train on `device`: one rank per GPU on CUDA
    (GPUs 0..nproc-1, so a plain "cuda"), any number on the CPU."""
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1 (trainer processes; one per GPU on CUDA), got {nproc}")
    if nproc == 1:
        return
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"--nproc {nproc} trains on cpu (gloo) or cuda (NCCL), not on {device!r}")
    if kind == "cuda":
        if index:
            raise ValueError(
                f"--nproc {nproc} puts rank r on GPU r: pass --device cuda, not {device!r} "
                "(CUDA_VISIBLE_DEVICES chooses which GPUs)"
            )
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if nproc > count:
            raise ValueError(
                f"--nproc {nproc} needs {nproc} CUDA devices (one per rank) but this machine has "
                f"{count}: pass --nproc {max(count, 1)}" + ("" if count else " or --device cpu")
            )


def launch(nproc: int, entrypoint: Callable[..., Any], *args: Any) -> Any:
    """Run `entrypoint(*args)` in `nproc` new processes (spawned: `entrypoint` and `args` must pickle) and return
    rank 0's return value. RanksFailedError when a rank fails."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        start_method="spawn",
    )
    try:
        return elastic_launch(config, entrypoint)(*args)[0]
    except ChildFailedError as err:
        raise RanksFailedError(f"a trainer rank failed; the others were stopped.\n{err.format_msg()}") from None
