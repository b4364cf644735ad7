"""Trainer ranks for the commands that train, `spotlight train` and `spotlight run`: the --nproc checks, and the
command's work run on rank 0 of N launched processes whose updates the others join (workers/trainer/launch.py,
ranks.py). Only typer at import time: `--help` stays instant.

Rank 0 runs `main` whole (the driver or the Dagster walk, and whatever it starts: a local worker cluster, the
ledger, every store write); the train phase it reaches sends each update's order to the other ranks
(workers/coordinator/train.py), which only join updates until rank 0's `main` returns.

Example:
    check_ranks(nproc, "cuda", config)                                   # typer.BadParameter before any compute
    code = in_ranks(nproc, gradient_checkpointing, "cuda", walk, {"spec": spec})  # walk(spec=spec) on rank 0
"""

from __future__ import annotations

from typing import Any, Callable

import typer


def check_ranks(nproc: int, device: str, config) -> None:
    """typer.BadParameter (on --nproc) unless `nproc` ranks fit `device` and every rank gets a sample of each of
    `config`'s minibatches."""
    from workers.trainer.launch import check_nproc

    try:
        check_nproc(nproc, device)
        if nproc > 1:
            from workers.trainer.fsdp import check_batch_split

            check_batch_split(config.prompts_per_iteration * config.group_size, config.grpo.num_minibatches, nproc)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--nproc") from None


def check_memory(config) -> None:
    """typer.BadParameter naming the knobs when the memory plan (workers/trainer/memory_plan.py) of a run on a
    diffusers pipeline exceeds its GPU: `train.gpu_memory_gb`, else the CUDA device's own size. Nothing for the
    pixel policy or a CPU run with no size given."""
    if config.model.model is None:
        return
    gpu_GB = config.train.gpu_memory_gb
    if gpu_GB is None and config.train.device.startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            gpu_GB = torch.cuda.get_device_properties(torch.device(config.train.device).index or 0).total_memory / 1e9
    if gpu_GB is None:
        return
    from workers.trainer.memory_plan import MemoryPlanError, check_fits, plan_memory
    from workers.trainer.model_sizes import model_sizes

    try:
        check_fits(plan_memory(config, model_sizes(config.model.model, config.model.lora_rank), gpu_GB))
    except MemoryPlanError as err:
        raise typer.BadParameter(str(err), param_hint="--gpu-memory-gb") from None


def in_ranks(
    nproc: int, gradient_checkpointing: bool, device: str, main: Callable[..., Any], kwargs: dict, failed_hint: str = ""
) -> Any:
    """`main(**kwargs)` in this process (nproc 1), or on rank 0 of `nproc` launched processes whose updates the
    others join; returns what `main` returned. `main` and `kwargs` must pickle (a module-level function). A failed
    or signalled rank stops them all: the command exits 1, printing the error and `failed_hint`."""
    if nproc == 1:
        from workers.trainer.ranks import TrainerSetup, trainer_setup

        with trainer_setup(TrainerSetup(gradient_checkpointing)):
            return main(**kwargs)
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from workers.trainer.launch import RanksFailedError, launch

    try:
        return launch(nproc, _rank_main, gradient_checkpointing, device, main, kwargs)
    except (RanksFailedError, SignalException) as err:
        said = str(err) if isinstance(err, RanksFailedError) else f"the trainer ranks were stopped by {err.sigval.name}"
        typer.echo(said + (f"\n{failed_hint}" if failed_hint else ""), err=True)
        raise typer.Exit(1) from None


def _rank_main(gradient_checkpointing: bool, device: str, main: Callable[..., Any], kwargs: dict) -> Any:
    """One of the launched processes: rank 0 runs `main`, the others join its updates until it returns."""
    from workers.coordinator.train import follow_orders
    from workers.trainer.ranks import TrainerSetup, join_ranks, leave_ranks, trainer_setup

    ranks = join_ranks(device)
    result = None
    with trainer_setup(TrainerSetup(gradient_checkpointing, ranks)) as setup:
        if ranks.rank == 0:
            result = main(**kwargs)
            ranks.send(None)  # only once main returned: a rank 0 that raised exits, and the launcher stops the others
        else:
            joined = follow_orders(setup)
            typer.echo(f"trainer rank {ranks.rank}: joined {joined} update(s)", err=True)
    leave_ranks()
    return result
