"""The rollout worker's settings as one frozen, typed config: what its claim loop reads.

`python -m workers.rollout` parses and checks its flags (workers/rollout/worker.py), fills in the worker id and
instance label, and hands the loop a `WorkerConfig`, not the argparse Namespace. The knobs a run sets (commit_every,
lease_s, resident_dtype, poll_s) have their one default and bounds in the run's config tree
(resources/settings/config.py, `WorkersSection`); `--config FILE` hands a worker the run's saved config.yaml, whose
`workers` section, `model.model` and `train.device` it takes unless a flag says otherwise.

Example:
    config = WorkerConfig.from_args(parse_worker_args(build_parser(), argv))
    WorkerLoop(queue, store, config, stop, report).run()
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from pydantic import ValidationError

from resources.settings.config import RunConfig, WorkersSection
from resources.settings.sections import ResidentDtype

KNOBS = WorkersSection()
"""The worker knobs' defaults: the run config tree's, their one home."""
WORKER_KNOBS = ("commit_every", "lease_s", "resident_dtype", "poll_s")
"""The WorkersSection fields a worker process reads, each its flag of the same name (`--lease-s`)."""
RESIDENT_DTYPES: tuple[str, ...] = typing.get_args(ResidentDtype)
"""Choices of WorkerConfig.resident_dtype (workers/rollout/weights.py says what each holds)."""


@dataclass(frozen=True)
class WorkerConfig:
    """One rollout worker: who it is, how it claims and samples, and its price labels for the ledger."""

    worker_id: str
    """Unique worker name (HOST-PID unless given)."""
    commit_every: int = KNOBS.commit_every
    """Commit in-flight state every this many denoising steps."""
    lease_s: float = KNOBS.lease_s
    """Queue lease length in seconds; heartbeats every third."""
    device: str = "cpu"
    """torch device for sampling."""
    model: Optional[str] = None
    """The diffusers pipeline folder the run trains (absolute); None: whatever the anchor names."""
    resident_dtype: str = KNOBS.resident_dtype
    """How the policy's weights are held: bf16 (the parameters are the PULSE-patched BF16 weights; BF16 forwards
    only), fp32 (FP32 parameters fed from a BF16 dict; any forward dtype), auto (bf16 on CUDA, else fp32)."""
    threads: Optional[int] = None
    """torch CPU threads; None: torch's choice."""
    poll_s: float = KNOBS.poll_s
    """Wait between claims while the queue is empty."""
    max_idle_s: Optional[float] = None
    """Exit after this long without work; None: run until stopped."""
    step_delay_s: float = 0.0
    """Extra seconds per denoising step (simulates a slower device)."""
    instance_type: Optional[str] = None
    """Instance label for the ledger."""
    gpu_type: Optional[str] = None
    """GPU label for the ledger."""
    spot: bool = True
    """Preemptible capacity (else reserved)."""
    usd_per_hour: Optional[float] = None
    """Price of this worker for the ledger; None: from the price table."""

    def __post_init__(self) -> None:
        check_knobs({name: getattr(self, name) for name in WORKER_KNOBS})

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "WorkerConfig":
        """The config of parsed (and checked) worker flags; flags the loop does not read are left out."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def check_knobs(values: dict) -> None:
    """ValueError naming the flag when a knob is out of the bounds its WorkersSection field declares."""
    try:
        WorkersSection(**values)
    except ValidationError as err:
        raise ValueError(
            "; ".join(f"--{str(e['loc'][0]).replace('_', '-')} {e['input']!r}: {e['msg']}" for e in err.errors())
        ) from None


def load_run_config(path: str | Path) -> RunConfig:
    """The run's config tree from its YAML (`spotlight config` / `<run-dir>/config.yaml`); ConfigError (a ValueError)
    naming the file when it cannot be read or is not a whole, valid tree."""
    from resources.settings.resolve import ConfigError, load_config  # lazy: --help stays instant

    try:
        return load_config(Path(path))
    except ConfigError as err:
        raise ConfigError(f"--config {err}") from None


def run_config_defaults(config: RunConfig) -> dict:
    """What a worker takes from the run's config: its knobs, the pipeline folder the run trains, and where it
    samples (the run's device: on a GPU node, its GPU)."""
    return {
        **{name: getattr(config.workers, name) for name in WORKER_KNOBS},
        "model": config.model.model,
        "device": config.train.device,
    }


def add_config_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        help="The run's config.yaml (what spotlight run saves in its run folder, spotlight launch ships to each node):"
        " the worker takes its workers section (" + ", ".join(WORKER_KNOBS) + "), model.model and train.device "
        "from there. A flag given as well wins.",
    )


def parse_worker_args(
    p: argparse.ArgumentParser, argv: Sequence[str] | None, defaults=run_config_defaults
) -> argparse.Namespace:
    """The parsed flags; with `--config FILE`, the file's values (`defaults(config)`) replace the flags' defaults,
    so a flag given on the command line still wins. A file that cannot be used stops the parse (exit 2)."""
    args = p.parse_args(argv)
    if args.config is not None:
        try:
            p.set_defaults(**defaults(load_run_config(args.config)))
        except ValueError as err:
            p.error(str(err))
        args = p.parse_args(argv)
    return args
