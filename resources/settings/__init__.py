"""The run's settings, each declared once: its type, default, help, command-line flag and SPOTLIGHT_* variable.

They are declared in training.py and deployment.py; everything else is derived from them: the options of
`spotlight run` and `spotlight train` (pipelines/settings_cli.py), the keys of their `--config run.yaml`, the
variables `dagster dev` reads (pipelines/deploy.py), the fields of the Dagster `RunConfigResource`
(assets/run_config.py) and `spotlight run`'s stored `RunSpec`. It lives at the bottom layer so that every room may
read it, and imports only the standard library so that `spotlight --help` stays instant.

Example:
    SETTINGS["on_hacking"].cli_flag, SETTINGS["on_hacking"].env_name   # "--on-hacking", "SPOTLIGHT_ON_HACKING"
    [s.name for s in settings_of("run")]                               # the settings `spotlight run` takes
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from resources.settings.base import (
    COMMANDS,
    DEPLOYMENTS,
    LEGACY_RUN_ROLLOUTS,
    ROLLOUT_MODES,
    RUN_ROLLOUTS,
    Advantage,
    Deployment,
    OnHacking,
    RunRollouts,
    SamplingMode,
    Setting,
    SyncMode,
)
from resources.settings.deployment import DEPLOYMENT
from resources.settings.training import TRAINING

__all__ = [
    "Advantage",
    "COMMANDS",
    "DEPLOYMENTS",
    "LEGACY_RUN_ROLLOUTS",
    "ROLLOUT_MODES",
    "RUN_ROLLOUTS",
    "SETTINGS",
    "Deployment",
    "OnHacking",
    "RunRollouts",
    "SamplingMode",
    "Setting",
    "SyncMode",
    "check_bounds",
    "env_settings",
    "resource_settings",
    "run_rollouts",
    "settings_class",
    "settings_of",
    "with_default",
]

_DECLARED = TRAINING + DEPLOYMENT
SETTINGS: dict[str, Setting] = {s.name: s for s in _DECLARED}


def settings_of(command: str) -> tuple[Setting, ...]:
    """The settings a command takes as flags, in the table's order."""
    return tuple(s for s in _DECLARED if command in s.commands)


def resource_settings() -> tuple[Setting, ...]:
    """The settings that are fields of the Dagster RunConfigResource."""
    return tuple(s for s in _DECLARED if s.resource)


def env_settings() -> tuple[Setting, ...]:
    """The settings `dagster dev` reads from SPOTLIGHT_* variables."""
    return tuple(s for s in _DECLARED if s.env_name is not None)


def with_default(setting: Setting, default: Any) -> Setting:
    """The same setting with a command's own default (e.g. `spotlight train`'s preset)."""
    return dataclasses.replace(setting, default=default)


def settings_class(command: str, leading: tuple = (), defaults: Optional[dict] = None) -> type:
    """A frozen dataclass with one field per setting of `command` (its type and default; `defaults` replace some),
    after the `leading` fields ((name, type) without defaults): the typed settings a command works with."""
    defaults = defaults or {}
    fields = [
        (s.name, s.type, dataclasses.field(default=defaults.get(s.name, s.default))) for s in settings_of(command)
    ]
    return dataclasses.make_dataclass(f"{command.title()}Settings", [*leading, *fields], frozen=True)


_BOUND_CHECKS = {
    "ge": (">=", lambda v, b: v >= b),
    "gt": (">", lambda v, b: v > b),
    "le": ("<=", lambda v, b: v <= b),
    "lt": ("<", lambda v, b: v < b),
}


def check_bounds(values: Any, command: str) -> None:
    """Refuse a setting of `command` that is given (not None) and outside its declared bounds, naming its flag:
    the same bounds the CLI and the Dagster resource enforce, for settings built in code (RunSpec, run.json)."""
    for s in settings_of(command):
        value = getattr(values, s.name)
        if value is None or isinstance(value, bool):
            continue
        for kind, bound in s.bounds.items():
            word, ok = _BOUND_CHECKS[kind]
            if not ok(value, bound):
                raise ValueError(f"{s.cli_flag} must be {word} {bound}, got {value}")


def run_rollouts(value: str) -> str:
    """A `--rollouts` value as the run uses it: a legacy name becomes the mode it meant."""
    value = LEGACY_RUN_ROLLOUTS.get(value, value)
    if value not in RUN_ROLLOUTS:
        raise ValueError(f"--rollouts must be one of {RUN_ROLLOUTS}, got {value!r}")
    return value
