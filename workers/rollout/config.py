"""The rollout worker's settings as one frozen, typed config: what its claim loop reads.

`python -m workers.rollout` parses and checks its flags (workers/rollout/worker.py), fills in the worker id and
instance label, and hands the loop a `WorkerConfig`, not the argparse Namespace.

Example:
    config = WorkerConfig.from_args(build_parser().parse_args(argv))
    WorkerLoop(queue, store, config, stop, report).run()
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Optional

RESIDENT_DTYPES = ("auto", "bf16", "fp32")
"""Choices of WorkerConfig.resident_dtype (workers/rollout/weights.py says what each holds)."""


@dataclass(frozen=True)
class WorkerConfig:
    """One rollout worker: who it is, how it claims and samples, and its price labels for the ledger."""

    worker_id: str
    """Unique worker name (HOST-PID unless given)."""
    commit_every: int = 2
    """Commit in-flight state every this many denoising steps."""
    lease_s: float = 60.0
    """Queue lease length in seconds; heartbeats every third."""
    device: str = "cpu"
    """torch device for sampling."""
    model: Optional[str] = None
    """The diffusers pipeline folder the run trains (absolute); None: whatever the anchor names."""
    resident_dtype: str = "auto"
    """How the policy's weights are held: bf16 (the parameters are the PULSE-patched BF16 weights; BF16 forwards
    only), fp32 (FP32 parameters fed from a BF16 dict; any forward dtype), auto (bf16 on CUDA, else fp32)."""
    threads: Optional[int] = None
    """torch CPU threads; None: torch's choice."""
    poll_s: float = 0.2
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
        if self.commit_every < 1:
            raise ValueError(f"commit_every (--commit-every) must be >= 1, got {self.commit_every}")
        if not (self.lease_s > 0 and self.poll_s > 0):
            raise ValueError(f"lease_s and poll_s (--lease-s, --poll-s) must be > 0, got {self.lease_s}, {self.poll_s}")
        if self.resident_dtype not in RESIDENT_DTYPES:
            raise ValueError(
                f"resident_dtype (--resident-dtype) must be one of {RESIDENT_DTYPES}, got {self.resident_dtype!r}"
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "WorkerConfig":
        """The config of parsed (and checked) worker flags; flags the loop does not read are left out."""
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})
