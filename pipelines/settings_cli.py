"""Typer options derived from the config tree (resources/settings/): a command declares none of them itself.

`settings_options(COMMAND_KEYS["run"])` gives a command function one option per leaf of the tree it takes, each
defaulting to None (not given), so that the flags layer holds only what was typed; the help says the tree's default.
The command receives them as `**settings` and hands them to `resolve_command` (pipelines/config_cli.py), which
layers them over the preset, `--config` files and SPOTLIGHT_* variables. Flags of renamed settings are kept hidden,
only to refuse them with the new name.

Example:
    @settings_options(COMMAND_KEYS["train"])
    def train_command(out: Optional[Path] = typer.Option(None), **settings) -> None:
        resolved = resolve_command(settings, config_files, default_preset="cpu_tiny_long")
"""

from __future__ import annotations

import functools
import inspect
import typing
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import typer

from resources.settings.fields import BY_NAME, LEAVES, Leaf
from resources.settings.resolve import RENAMED

ALL_KEYS = tuple(LEAVES)
TRAIN_KEYS = tuple(
    k for k in LEAVES if LEAVES[k].section not in ("workers", "deployment") or k == "deployment.reserved_usd_per_hour"
)
"""`spotlight train` runs in one process on this machine: no worker pool, no deployment but its price."""
COMMAND_KEYS = {"run": ALL_KEYS, "config": ALL_KEYS, "train": TRAIN_KEYS}
"""The leaves each command takes as flags (dotted keys)."""


def cli_type(leaf: Leaf) -> Any:
    """The option's type: Optional (None = not given); a path is a Path; a tuple of names a repeated option."""
    inner = leaf.inner
    if leaf.is_path:
        inner = Path
    elif typing.get_origin(inner) is tuple and typing.get_args(inner)[-1] is Ellipsis:
        inner = list.__class_getitem__(typing.get_args(inner)[0])
    return Optional[inner]


def cli_help(leaf: Leaf) -> str:
    default = leaf.default
    shown = "unset" if default is None else default
    return f"{leaf.help} [{leaf.key}; default {shown}, or the preset's]"


def option_parameter(leaf: Leaf) -> inspect.Parameter:
    """The keyword parameter typer reads as the leaf's option."""
    flag = leaf.flag
    if leaf.inner is bool:
        flag = f"{flag}/--no-{flag[2:]}"
    option = typer.Option(None, flag, help=cli_help(leaf), show_default=False)
    return inspect.Parameter(leaf.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=cli_type(leaf))


def _refuse_renamed(old: str, new: str) -> Callable:
    def callback(ctx: typer.Context, param: typer.CallbackParam, value: Any) -> Any:
        if value is not None:
            raise typer.BadParameter(f"{old} was renamed {new}; pass that instead")  # click names the option
        return value

    return callback


def renamed_parameters(keys: Iterable[str]) -> list[inspect.Parameter]:
    """Hidden options under the old names of renamed settings the command takes: each refuses itself."""
    names = {LEAVES[k].name for k in keys}
    params = []
    for old, new in RENAMED.items():
        if new in names and old != new:
            old_flag = "--" + old.replace("_", "-")
            option = typer.Option(None, old_flag, hidden=True, callback=_refuse_renamed(old_flag, BY_NAME[new].flag))
            params.append(
                inspect.Parameter(f"renamed_{old}", inspect.Parameter.KEYWORD_ONLY, default=option, annotation=str)
            )
    return params


def settings_options(keys: Iterable[str]) -> Callable:
    """Decorator: the command function's own parameters plus one option per leaf in `keys`, handed to it as
    `**settings` by field name (None: not given)."""
    keys = tuple(keys)

    def wrap(func: Callable) -> Callable:
        hints = typing.get_type_hints(func)
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(func).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        options = [option_parameter(LEAVES[k]) for k in keys]
        renamed = renamed_parameters(keys)

        @functools.wraps(func)
        def command_function(**kwargs):
            for p in renamed:
                kwargs.pop(p.name, None)
            return func(**kwargs)

        params = options + renamed + own
        command_function.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command_function.__annotations__ = {p.name: p.annotation for p in params}
        del command_function.__wrapped__  # typer must read the signature above, not the function's own
        return command_function

    return wrap
