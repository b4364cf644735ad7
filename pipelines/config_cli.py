"""`--config FILE` and the resolution every command that runs shares; `spotlight config`, which prints the tree.

Order (later wins, key by key): the preset (with `--model DIR` and none named: the folder's family's,
pipelines/run_defaults.py), then each `--config FILE` in the order given, then SPOTLIGHT_* variables, then flags; then
what the device decides where none of them said (no injected preemptions on a GPU, in-process rollouts when the
trainer holds every GPU). `resolve_command` does it once and turns a bad value into a usage error that names the key,
where it was set and what is allowed, before any compute.

Example:
    spotlight config --preset cpu_smoke --group-size 4            # the resolved tree as YAML
    spotlight config --config run.yaml --explain                  # each value that is not the tree's default, and
                                                                  # where it came from
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import typer

from pipelines.settings_cli import COMMAND_KEYS, settings_options

CONFIG_HELP = (
    "A YAML file of run settings: sections (train: {group_size: 8}), dotted keys (train.group_size: 8) or field names "
    "(group-size: 8), as `spotlight config` prints them. Repeatable; later files, SPOTLIGHT_* variables and flags win."
)


def config_option():
    """The `--config` option (repeatable)."""
    return typer.Option(None, "--config", help=CONFIG_HELP, dir_okay=False)


def resolve_settings(
    flags: Mapping[str, Any],
    config_files: Optional[Sequence[Path]],
    *,
    default_preset: str = "cpu_tiny_spot",
    env: Mapping[str, str] = os.environ,
    base=None,
    check_paths: bool = True,
    base_origin: str = "preset",
    command: Optional[tuple[str, Mapping[str, Any]]] = None,
):
    """The `Resolved` config (resources/settings/resolve.py) of a command's flags (by field name, None: not given)
    over its `--config` files, the SPOTLIGHT_* variables in `env` and the preset (or `base`, a run's stored config,
    for --resume); `command`: (its name, dotted key -> value) for what the command itself fixes, applied last.
    ConfigError saying what to change."""
    from pipelines.run_defaults import device_layer, family_layers
    from resources.settings.resolve import Layer, env_layer, file_layer, flag_layer, resolve
    from workers.trainer.presets import PRESETS

    layers = [file_layer(Path(f)) for f in (config_files or ())]
    layers += [env_layer(env), flag_layer(flags)]
    if command is not None:
        name, fixed = command
        layers.append(Layer(name, dict(fixed), {key: name for key in fixed}))
    if base is not None:  # --resume: the stored run decided these when it started
        return resolve(layers, PRESETS, default_preset, base=base, check_paths=check_paths, base_origin=base_origin)
    layers = [*family_layers(layers, default_preset), *layers]
    resolved = resolve(layers, PRESETS, default_preset, check_paths=check_paths)
    decided = device_layer(resolved)
    return (
        resolved if decided is None else resolve([*layers, decided], PRESETS, default_preset, check_paths=check_paths)
    )


def resolve_command(flags: Mapping[str, Any], config_files: Optional[Sequence[Path]], **kw):
    """resolve_settings, with a ConfigError turned into the command's usage error."""
    from resources.settings.resolve import ConfigError

    try:
        return resolve_settings(flags, config_files, **kw)
    except ConfigError as err:
        raise typer.BadParameter(str(err)) from None


@settings_options(COMMAND_KEYS["config"])
def config_command(
    config_files: Optional[list[Path]] = config_option(),
    explain: bool = typer.Option(
        False, "--explain", help="List each value that is not the tree's default and where it was set, not the YAML."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the tree as JSON."),
    list_presets: bool = typer.Option(False, "--list", help="List the presets, with the first line of each's doc."),
    memory: Optional[float] = typer.Option(
        None,
        "--memory",
        metavar="GPU_GB",
        help="Print the run's memory plan per GPU of this many GB (the model built on the meta device; needs "
        "--model) instead of the tree, and exit 1 when it cannot fit.",
    ),
    **settings,
) -> None:
    """Print the run config that `spotlight run` (or train, or launch) would run with these settings: the preset,
    then --config files, then SPOTLIGHT_* variables, then flags."""
    if list_presets:
        from workers.trainer.presets import PRESETS

        for name, make in PRESETS.items():
            typer.echo(f"{name:<20} {(make.__doc__ or '').strip().splitlines()[0]}")
        return
    resolved = resolve_command(settings, config_files, check_paths=False)
    if memory is not None:
        show_memory_plan(resolved.config, memory, as_json)
        return
    if explain:
        rows = resolved.explain()
        width = max(len(k) for k, _, _ in rows)
        for key, value, origin in rows:
            typer.echo(f"{key:<{width}}  {value!r:<24}  {origin}")
        return
    if as_json:
        import json

        typer.echo(json.dumps(resolved.config.model_dump(mode="json"), indent=2))
        return
    from resources.settings.resolve import to_yaml

    typer.echo(to_yaml(resolved.config), nl=False)


def show_memory_plan(config, gpu_GB: float, as_json: bool) -> None:
    """Print the memory plan of `config` on GPUs of `gpu_GB`; exit 1 when it does not fit."""
    if config.model.model is None:
        raise typer.BadParameter("the memory plan is for a diffusers pipeline: pass --model DIR", param_hint="--memory")
    if not gpu_GB > 0:
        raise typer.BadParameter(f"must be a positive number of GB, got {gpu_GB:g}", param_hint="--memory")
    from workers.trainer.memory_plan import format_plan, plan_as_json, plan_memory
    from workers.trainer.model_sizes import model_sizes

    try:
        plan = plan_memory(config, model_sizes(config.model.model, config.model.lora_rank), gpu_GB)
    except (OSError, ValueError) as err:
        raise typer.BadParameter(str(err), param_hint="--model") from None
    if as_json:
        import json

        typer.echo(json.dumps(plan_as_json(plan), indent=2))
    else:
        typer.echo(format_plan(plan))
    if not plan.fits:
        raise typer.Exit(1)
