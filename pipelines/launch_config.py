"""The run settings of `spotlight launch`: the run's config tree resolved as `spotlight config` resolves it, from
`--config FILE`, SPOTLIGHT_* variables and every setting's own flag, none of them declared by launch.

Only the standard library at import time; the tree and the presets load inside the functions, so `spotlight
launch --help` stays instant.

Example:
    run = resolve_launch_run(Path("run.yaml"), ["--store", "s3://b/p", "--lease-s", "7"], os.environ)
    run.deployment.store, run.workers.lease_s, run.train.device        # "s3://b/p", 7.0, "cuda"
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from resources.settings.config import RunConfig
    from resources.settings.resolve import Layer

LAUNCH_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}
"""`spotlight launch`'s typer settings: the run settings' flags are declared nowhere in launch; they reach
`ctx.args` and are read against the config tree (`run_settings`)."""
RUN_SETTINGS_HELP = (
    "Run settings: every setting of the run's config tree, as in spotlight run and spotlight config (--preset, "
    "--store, --model, --iterations, --reward, --prompts, --group-size, --lease-s, ...: `spotlight config` prints "
    "them all), from --config FILE, SPOTLIGHT_* variables and these flags, resolved as `spotlight config` resolves "
    "them. --store (an s3:// store every node shares) is required; paths (--model, --prompts) are absolute paths "
    "on the nodes."
)
LAUNCH_DEFAULTS = {"train.device": "cuda"}
"""Run settings a launch starts from where the preset has its own (file, variables and flags still win): the
trainer runs on the reserved node's GPU."""


def resolve_launch_run(config: Optional[Path], args: list[str], env) -> "RunConfig":
    """The run's config tree as `spotlight config` resolves it (the preset, LAUNCH_DEFAULTS, `--config`, SPOTLIGHT_*
    variables, then the run settings' flags in `args`), before the cloud places it. A path setting must be absolute:
    the nodes, not this machine, read it (and it is not checked here)."""
    from resources.settings.resolve import Layer, env_layer, file_layer, resolve
    from workers.trainer.presets import PRESETS

    where = "spotlight launch (the nodes' GPUs)"
    layers = [Layer("launch", dict(LAUNCH_DEFAULTS), {key: where for key in LAUNCH_DEFAULTS})]
    layers += [file_layer(config)] if config is not None else []
    layers += [env_layer(env), run_settings(args)]
    _check_node_paths(layers)
    return resolve([*_family_layers(layers), *layers], PRESETS, check_paths=False).config


def _family_layers(layers: list["Layer"]) -> list["Layer"]:
    """The preset `--model`'s family decides (pipelines/run_defaults.py) when no layer names one. The folder is the
    nodes' path: read here when this machine has it too; otherwise ConfigError asking for --preset (a GPU model on
    the tiny CPU preset would load in FP32 with the wrong recipe and reward)."""
    from pipelines.run_defaults import FAMILY_PRESETS, family_layers
    from resources.settings.resolve import ConfigError

    model = [layer for layer in layers if layer.values.get("model.model")]
    if not model or any("preset" in layer.values for layer in layers):
        return []
    folder = Path(model[-1].values["model.model"])
    if not (folder / "model_index.json").is_file():
        choices = ", ".join(f"{preset} ({family})" for family, preset in FAMILY_PRESETS.items())
        raise ConfigError(
            f"{model[-1].where['model.model']}: {folder} is not on this machine, so its family cannot choose the "
            f"preset: name it with --preset ({choices})"
        )
    return family_layers(layers, "cpu_tiny_spot")


def run_settings(args: list[str]) -> "Layer":
    """The run settings' flags among launch's extra arguments (`--group-size 4`, `--lease-s=7`, `--explore`,
    `--no-explore`), read against the config tree as SPOTLIGHT_* variables are; ConfigError naming an unknown
    flag (and the closest ones)."""
    from resources.settings.resolve import ConfigError, Layer, env_layer, leaf_for

    raw: dict[str, str] = {}
    flags: dict[str, str] = {}
    rest = list(args)
    while rest:
        token = rest.pop(0)
        if not token.startswith("--"):
            raise ConfigError(f"spotlight launch: unexpected argument {token!r}")
        name, has_value, value = token[2:].partition("=")
        negated = name.startswith("no-") and name[3:].replace("-", "_") in _bool_names()
        leaf = leaf_for(name[3:] if negated else name, f"spotlight launch {token}")
        if leaf.inner is bool:
            value = "false" if negated else (value if has_value else "true")
        elif not has_value:
            if not rest:
                raise ConfigError(f"spotlight launch: {token} needs a value")
            value = rest.pop(0)
        raw[leaf.env], flags[leaf.key] = value, leaf.flag
    parsed = env_layer(raw)
    return Layer("flags", parsed.values, {key: flags[key] for key in parsed.values})


def _bool_names() -> set[str]:
    from resources.settings.fields import LEAVES

    return {leaf.name for leaf in LEAVES.values() if leaf.inner is bool}


def _check_node_paths(layers) -> None:
    """ConfigError naming a relative path setting: a node reads it at that same path, so it must be absolute (the
    run folder excepted: the launch places the node's own)."""
    from resources.cloud.tasks import CLOUD_PLACED
    from resources.settings.fields import LEAVES
    from resources.settings.resolve import ConfigError

    for layer in layers:
        for key, value in layer.values.items():
            if key in CLOUD_PLACED or not LEAVES[key].is_path:
                continue
            if isinstance(value, str) and "://" not in value and not value.startswith("/"):
                raise ConfigError(
                    f"{layer.where[key]}: {key} {value!r} must be an absolute path: every node reads it at that "
                    "same path"
                )
