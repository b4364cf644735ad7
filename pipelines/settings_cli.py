"""Typer options derived from the run settings (resources/settings/): a command declares none of them itself.

`settings_options("run")` gives a command function that takes `**settings` every setting of `spotlight run` as a
typer option: the flag, type, default and help come from the setting, so `spotlight run` and `spotlight train`
cannot drift apart, and their `--config run.yaml` keys (pipelines/config_file.py, read from the options) follow.
Only typer and the standard library at import time: `--help` stays instant.

Example:
    @settings_options("train", defaults={"preset": "cpu_tiny_long"})
    def train_command(out: Optional[Path] = typer.Option(None, help="..."), **settings) -> None:
        settings["preset"], settings["lora_rank"]
"""

from __future__ import annotations

import functools
import inspect
import typing
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import typer

from resources.settings import Setting, settings_of


def cli_type(setting: Setting, default: Any) -> Any:
    """The option's type: a path setting is a Path; None as the default makes it Optional."""
    base = setting.type
    if typing.get_origin(base) is typing.Union:
        base = next(a for a in typing.get_args(base) if a is not type(None))
    if setting.path:
        base = Path
    return Optional[base] if default is None else base


def cli_help(setting: Setting, default: Any, note: str = "") -> str:
    """The setting's help; when the command leaves it unset (None), the value that applies then."""
    text = setting.help
    if default is None and setting.default is not None:
        text += f" Default {setting.default}."
    return f"{text} {note}".strip()


def option_parameter(setting: Setting, default: Any, note: str = "") -> inspect.Parameter:
    """The keyword parameter typer reads as the setting's option."""
    option = typer.Option(
        default,
        setting.cli_flag,
        help=cli_help(setting, default, note),
        show_default="/" not in setting.cli_flag,
    )
    return inspect.Parameter(
        setting.name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=cli_type(setting, default)
    )


def settings_options(
    command: str,
    *,
    defaults: Optional[Mapping[str, Any]] = None,
    unset: bool = False,
    notes: Optional[Mapping[str, str]] = None,
) -> Callable:
    """Decorator: the command function's own parameters plus one option per setting of `command`, handed to it as
    `**settings`. `defaults`: the command's own defaults; `unset`: every setting defaults to None (not given, e.g.
    so that `--resume` can tell what was asked); `notes`: a sentence added to a setting's help."""
    defaults, notes = dict(defaults or {}), dict(notes or {})

    def wrap(func: Callable) -> Callable:
        hints = typing.get_type_hints(func)
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
            for p in inspect.signature(func).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD
        ]
        taken = settings_of(command)
        options = [
            option_parameter(s, None if unset else defaults.get(s.name, s.default), notes.get(s.name, ""))
            for s in taken
        ]

        @functools.wraps(func)
        def command_function(**kwargs):
            return func(**kwargs)

        command_function.__signature__ = inspect.Signature(options + own)
        command_function.__annotations__ = {p.name: p.annotation for p in options + own}
        del command_function.__wrapped__  # typer must read the signature above, not the function's own
        return command_function

    return wrap
