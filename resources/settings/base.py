"""The choices of names settings take."""

from __future__ import annotations

import typing
from typing import Literal

SamplingMode = Literal["inprocess", "local_cluster", "workers"]
"""How a rollout phase gets its samples (workers.coordinator.context.Sampling.mode): inprocess (the trainer,
batched), local_cluster (worker processes started for the phase and stopped after it) or workers (already pulling
from the queue: the pool `spotlight run` starts, or remote spot workers)."""
ROLLOUT_MODES: tuple[str, ...] = typing.get_args(SamplingMode)

OnHacking = Literal["warn", "stop", "rollback"]
SyncMode = Literal["lora", "merged"]
Advantage = Literal["total", "per-component"]
"""What the update's advantages normalise within each group: the total reward, or each component of a multi: reward."""
