"""`--config run.yaml` for the commands that train: a YAML mapping of the command's own options, flags win.

Keys are the options' names without the dashes (`rollout-batch` or `rollout_batch`, `micro-batch`, `model`, ...);
the file's values become the command's defaults (click's `default_map`), so anything given on the command line
replaces them and every value goes through the option's own type and checks. An unknown key fails before any
compute, naming the keys this command accepts.

Example run.yaml:
    model: /models/Qwen-Image
    preset: qwen_image_lora
    rollout-batch: 8
    micro-batch: 4
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

CONFIG_HELP = "A YAML file of this command's options (keys: option names without the dashes); flags given here win."


def _option_names(command) -> dict[str, str]:
    """Each way a file may spell an option (`rollout-batch`, `rollout_batch`) -> the parameter's name."""
    names = {}
    for param in command.params:
        for opt in getattr(param, "opts", []):
            if opt.startswith("--"):
                names[opt[2:]] = param.name
                names[opt[2:].replace("-", "_")] = param.name
        names[param.name] = param.name
    names.pop("config", None)
    return names


def load_config_file(ctx: typer.Context, param: typer.CallbackParam, value: Optional[Path]) -> Optional[Path]:
    """Eager callback of `--config`: the file's options become the command's defaults."""
    if value is None:
        return value
    import yaml

    try:
        raw = yaml.safe_load(Path(value).read_text())
    except (OSError, yaml.YAMLError) as err:
        raise typer.BadParameter(f"cannot read {value}: {err}", ctx=ctx, param=param) from None
    if raw is None:
        return value
    if not isinstance(raw, dict):
        raise typer.BadParameter(f"{value} must hold a mapping of option: value", ctx=ctx, param=param)
    names = _option_names(ctx.command)
    unknown = sorted(str(k) for k in raw if str(k) not in names)
    if unknown:
        accepted = sorted({k for k in names if "_" not in k or k.replace("_", "-") not in names})
        raise typer.BadParameter(
            f"{value}: unknown option(s) {unknown}; this command takes {accepted}", ctx=ctx, param=param
        )
    ctx.default_map = {**(ctx.default_map or {}), **{names[str(k)]: v for k, v in raw.items()}}
    return value


def config_option():
    """The `--config` option (eager, so the file is read before the other options take their defaults)."""
    return typer.Option(
        None, "--config", help=CONFIG_HELP, is_eager=True, callback=load_config_file, dir_okay=False, exists=True
    )
