"""What a run setting is (`Setting`: every name it goes by) and the choices of names settings take."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional

SamplingMode = Literal["inprocess", "local_cluster", "workers"]
"""Who samples a rollout phase (the Dagster `rollout_workers` resource, SPOTLIGHT_ROLLOUTS): inprocess (the trainer,
batched), local_cluster (worker processes started for the phase and stopped after it) or workers (already pulling
from the queue: the spot workers of a cloud deployment, or the pool `spotlight run` starts)."""
ROLLOUT_MODES: tuple[str, ...] = typing.get_args(SamplingMode)

RunRollouts = Literal["local_pool", "inprocess", "local_cluster"]
"""Who samples for `spotlight run --rollouts`: local_pool (one pool of worker processes the command starts for the
whole run) or inprocess. local_cluster is the name runs stored before: it reads as local_pool."""
RUN_ROLLOUTS: tuple[str, ...] = ("local_pool", "inprocess")
LEGACY_RUN_ROLLOUTS = {"local_cluster": "local_pool"}
"""Old `--rollouts` values (a run.json written before) -> the mode they meant."""

Deployment = Literal["local", "cloud"]
DEPLOYMENTS: tuple[str, ...] = typing.get_args(Deployment)
OnHacking = Literal["warn", "stop", "rollback"]
SyncMode = Literal["lora", "merged"]
Advantage = Literal["total", "per-component"]
"""What the update's advantages normalise within each group: the total reward, or each component of a multi: reward."""

COMMANDS = ("run", "train")
"""The commands that take run settings (`spotlight run`, `spotlight train`)."""


@dataclass(frozen=True)
class Setting:
    """One run setting and every name it goes by."""

    name: str
    """The Python name: RunSpec's and RunConfigResource's field, the --config key (also with dashes)."""
    type: Any
    """Its type, Optional[...] when None means "the preset's" (or "not given"); Literal for a choice of names."""
    default: Any
    help: str
    """One sentence or two, shared by the flag, the variable and the Dagster resource field."""
    commands: tuple[str, ...] = COMMANDS
    """The commands that take it as a flag; () for a setting of the Dagster deployment only."""
    flag: Optional[str] = None
    """The flag (default: --name-with-dashes); a boolean's is "--x/--no-x"."""
    env: Optional[str] = None
    """The SPOTLIGHT_* variable `dagster dev` reads (default: SPOTLIGHT_NAME); "" for none."""
    bounds: dict = field(default_factory=dict)
    """pydantic bounds (ge, gt, le, lt) the value must meet."""
    path: bool = False
    """A local file or folder: a Path on the command line, stored absolute."""
    resource: bool = True
    """A field of the Dagster RunConfigResource (else the command or another resource uses it)."""

    @property
    def cli_flag(self) -> str:
        return self.flag or "--" + self.name.replace("_", "-")

    @property
    def env_name(self) -> Optional[str]:
        if self.env == "":
            return None
        return self.env or "SPOTLIGHT_" + self.name.upper()

    def choices(self) -> tuple[str, ...]:
        """The allowed names of a Literal setting, optional or not (empty for any other type)."""
        if typing.get_origin(self.type) is Literal:
            return typing.get_args(self.type)
        inner = [a for a in typing.get_args(self.type) if typing.get_origin(a) is Literal]
        return typing.get_args(inner[0]) if inner else ()


def setting(name: str, type_: Any, default: Any, help_: str, **kw) -> Setting:
    return Setting(name, type_, default, help_, **kw)


_PRESETS_DEFAULT = "the preset's"
