"""The pieces every section of the run's config tree is made of (resources/settings/config.py): the named choices, the
base model (unknown keys and wrong types refused), and the path and URL markers resolution reads."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Objective = Literal["flow_grpo", "nft"]
AdvNorm = Literal["group", "batch", "global_std"]
KlForm = Literal["step", "flow_grpo"]
NftWeighting = Literal["velocity", "adaptive"]
LrSchedule = Literal["constant", "cosine"]
ForwardDtype = Literal["auto", "fp32", "bf16"]
BaseDtype = Literal["fp32", "bf16"]
ResidentDtype = Literal["auto", "fp32", "bf16"]
Rollouts = Literal["local_pool", "inprocess", "local_cluster", "remote"]
"""Who samples each rollout phase: local_pool (worker processes this command starts for the whole run, preempted on a
Poisson trace: `spotlight run`'s default), inprocess (the trainer itself, batched), local_cluster (worker processes
started for each phase: the Dagster UI's), remote (workers that already pull from the queue: the cloud's spot jobs,
or `python -m workers.rollout` started by hand)."""
DeploymentKind = Literal["local", "cloud"]


def _path(help_: str) -> dict:
    """A local file or folder: made absolute when resolved (workers and a --resume elsewhere find the same one)."""
    return {"description": help_, "json_schema_extra": {"path": True}}


def _url(help_: str) -> dict:
    """A URL or a local path: a path is made absolute when resolved, a URL kept as it is."""
    return {"description": help_, "json_schema_extra": {"url": True}}


class Section(BaseModel):
    """A section of the tree: unknown keys and wrong types are refused, and a value is checked when set."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_assignment=True)
