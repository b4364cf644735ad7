"""Resolving a run's config once, in one documented order: the preset, then `--config FILE`s, then SPOTLIGHT_*
variables, then flags; later layers win, key by key.

A layer is a sparse map of dotted keys (`train.group_size`) to values, each with where it came from (`run.yaml:12`,
`SPOTLIGHT_GROUP_SIZE`, `--group-size`). Resolving applies them over the preset's whole config and validates the
result once; every error names the key, where it was set, and what is allowed, before any compute.

Example:
    layers = [file_layer(Path("run.yaml")), env_layer(os.environ), flag_layer({"group_size": 4})]
    resolved = resolve(layers, presets=PRESETS)
    resolved.config.train.group_size, resolved.origin("train.group_size")   # 4, "--group-size"
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

import yaml
from pydantic import ValidationError

from resources.settings.config import MODEL_ONLY_FIELDS, SECTIONS, RunConfig
from resources.settings.fields import BY_NAME, LEAVES, Leaf
from resources.urls import absolute_url

PRESET_ORIGIN = "preset"
DEFAULT_ORIGIN = "default"
MUST_EXIST = ("model.model", "model.checkpoint", "train.prompts", "validation.validation_prompts")
"""Path settings that must name something that exists on this machine when the run resolves."""
RENAMED = {
    "workers": "local_workers",
    "num_workers": "local_workers",
    "usd_per_hour": "reserved_usd_per_hour",
    "num_minibatches": "minibatches",
    "num_epochs": "epochs",
}
"""Names settings had before (a flag, a key, a variable) -> the setting's name now: refused with the new name."""
RENAMED_VALUES = {"deployment.rollouts": {"workers": "remote"}}
"""Values a setting took before -> the value that means the same now: refused with the new value."""


class ConfigError(ValueError):
    """A config that cannot run; the message names the key, where it was set and what is allowed."""


@dataclass(frozen=True)
class Layer:
    """One source of settings: dotted key -> value, and dotted key -> where it was set."""

    name: str
    """What the layer is: `file run.yaml`, `environment`, `flags`."""
    values: dict[str, Any] = field(default_factory=dict)
    where: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolved:
    """The resolved config and where each value came from."""

    config: RunConfig
    origins: dict[str, str]
    """Dotted key -> where its value was set (a file and line, a variable, a flag), or `preset` / `default`."""

    def origin(self, key: str) -> str:
        return self.origins.get(key, DEFAULT_ORIGIN)

    def given(self) -> dict[str, Any]:
        """The values set by a layer (not the preset's, not defaults), by dotted key."""
        return {k: get_value(self.config, k) for k, o in self.origins.items() if o != PRESET_ORIGIN}

    def explain(self) -> list[tuple[str, Any, str]]:
        """(key, value, origin) of every value that differs from the tree's default or was set by a layer."""
        rows = []
        for key, leaf in LEAVES.items():
            value = get_value(self.config, key)
            origin = self.origin(key)
            if origin != DEFAULT_ORIGIN or _plain(value) != _plain(leaf.default):
                rows.append((key, _plain(value), origin))  # a default made absolute (a path) stays "default"
        return rows


def get_value(config: RunConfig, key: str) -> Any:
    section, _, name = key.rpartition(".")
    return getattr(getattr(config, section), name) if section else getattr(config, name)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def derive(base: RunConfig, preset: str, **sections: Mapping[str, Any]) -> RunConfig:
    """`base` with some fields of some sections changed, as preset `preset`, validated."""
    data = base.model_dump()
    data["preset"] = preset
    for section, changes in sections.items():
        if section not in SECTIONS:
            raise ConfigError(f"unknown section {section!r}; the sections are {list(SECTIONS)}")
        data[section] = {**data[section], **changes}
    return RunConfig.model_validate(data)


def to_yaml(config: RunConfig) -> str:
    """The whole tree as YAML, section by section (what `spotlight config` prints and config.yaml holds)."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, default_flow_style=False, width=100)


CONFIG_NAME = "config.yaml"
"""In the run folder: the run's resolved config, what `--resume` continues and every worker reads."""


def save_config(config: RunConfig) -> Path:
    """`<run-dir>/config.yaml`, readable by its owner only (0600: a queue URL given with its password keeps it)."""
    run_dir = Path(config.deployment.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / CONFIG_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(to_yaml(config))
    return path


def load_config(path: Path) -> RunConfig:
    """A saved config.yaml (the whole tree); ConfigError naming the file when it is not one."""
    try:
        return RunConfig.model_validate(yaml.safe_load(Path(path).read_text()))
    except (OSError, yaml.YAMLError, ValidationError) as err:
        raise ConfigError(f"{path}: not a spotlight run config ({' '.join(str(err).split())[:300]})") from None


def leaf_for(key: str, where: str) -> Leaf:
    """The leaf a file key, dotted key or flat name names (dashes read as underscores); ConfigError naming the
    closest keys otherwise, and the new name of a renamed one."""
    norm = key.replace("-", "_")
    if norm in LEAVES:
        return LEAVES[norm]
    if norm in BY_NAME:
        return BY_NAME[norm]
    last = norm.rpartition(".")[2]
    if last in RENAMED:
        raise ConfigError(f"{where}: {key!r} was renamed {BY_NAME[RENAMED[last]].key!r}; use that")
    close = difflib.get_close_matches(norm, list(LEAVES) + list(BY_NAME), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ConfigError(
        f"{where}: unknown key {key!r}{hint} The keys are a section's fields (`spotlight config` prints them all): "
        + ", ".join(f"{s}.*" for s in SECTIONS)
    )


def file_layer(path: Path) -> Layer:
    """A YAML file's settings: nested sections (`train: {group_size: 8}`), dotted keys (`train.group_size: 8`) or
    flat field names (`group_size: 8`, `group-size: 8`); each remembers its line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"--config {path}: cannot read it ({err.strerror})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {path}: not YAML: {err}") from None
    layer = Layer(f"file {path}")
    if node is None:
        return layer
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}:{node.start_mark.line + 1}: the file must hold a mapping of key: value")
    _walk_mapping(node, "", path, layer)
    return layer


def _walk_mapping(node: yaml.MappingNode, prefix: str, path: Path, layer: Layer) -> None:
    for key_node, value_node in node.value:
        key = f"{prefix}{key_node.value}"
        where = f"{path}:{key_node.start_mark.line + 1}"
        if isinstance(value_node, yaml.MappingNode) and key.replace("-", "_") in SECTIONS:
            _walk_mapping(value_node, key + ".", path, layer)
            continue
        leaf = leaf_for(key, where)
        value = yaml.SafeLoader("").construct_document(value_node)
        if leaf.key in layer.values:
            raise ConfigError(f"{where}: {leaf.key} is set twice in {path} ({layer.where[leaf.key]} too)")
        layer.values[leaf.key] = value
        layer.where[leaf.key] = where


def env_layer(env: Mapping[str, str]) -> Layer:
    """The settings given as SPOTLIGHT_<FIELD> variables (an empty one is unset); a variable of a renamed setting
    is refused with the new name."""
    layer = Layer("environment")
    for leaf in LEAVES.values():
        raw = env.get(leaf.env)
        if raw:
            layer.values[leaf.key] = _env_value(leaf, raw)
            layer.where[leaf.key] = leaf.env
    for old, new in RENAMED.items():
        if env.get("SPOTLIGHT_" + old.upper()):
            raise ConfigError(f"SPOTLIGHT_{old.upper()} was renamed {BY_NAME[new].env}; set that instead")
    return layer


def _env_value(leaf: Leaf, raw: str) -> Any:
    """A variable's text as the field reads it: YAML for tuples and lists (`[0, 2]`, `0,2` too), the text itself
    otherwise (pydantic converts numbers and booleans, and refuses what is not one)."""
    if leaf.inner is not str and "tuple" in str(leaf.inner):
        text = raw if raw.lstrip().startswith("[") else f"[{raw}]"
        return yaml.safe_load(text)
    return raw


def flag_layer(values: Mapping[str, Any]) -> Layer:
    """The settings given as flags, by field name (None: not given)."""
    layer = Layer("flags")
    for name, value in values.items():
        if value is None:
            continue
        leaf = BY_NAME[name]
        layer.values[leaf.key] = str(value) if isinstance(value, Path) else value
        layer.where[leaf.key] = leaf.flag
    return layer


def preset_name(layers: Iterable[Layer], default: str) -> str:
    """The preset the layers ask for (the last that names one), else `default`."""
    name = default
    for layer in layers:
        name = layer.values.get("preset", name)
    return name


def resolve(
    layers: Iterable[Layer],
    presets: Mapping[str, Callable[[], RunConfig]],
    default_preset: str = "cpu_tiny_spot",
    base: Optional[RunConfig] = None,
    check_paths: bool = True,
    base_origin: str = PRESET_ORIGIN,
) -> Resolved:
    """The preset's config (or `base`, a run's stored config, whose values' origin is `base_origin`) with every layer
    applied in order, validated once; ConfigError naming the key, its origin and what is allowed."""
    layers = list(layers)
    if base is None:
        name = preset_name(layers, default_preset)
        if name not in presets:
            where = next((lay.where["preset"] for lay in reversed(layers) if "preset" in lay.values), "the default")
            raise ConfigError(f"{where}: unknown preset {name!r}; choose one of {sorted(presets)}")
        base = presets[name]()
    data = base.model_dump()
    origins: dict[str, str] = {}
    for layer in layers:
        for key, value in layer.values.items():
            _check_renamed_value(key, value, layer.where[key])
            section, _, leaf_name = key.rpartition(".")
            if section:
                data[section][leaf_name] = value
            else:
                data[leaf_name] = value
            origins[key] = layer.where[key]
    for key in LEAVES:
        if key not in origins and get_value(base, key) != LEAVES[key].default:
            origins[key] = base_origin
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_explain_validation(err, origins)) from None
    config = _absolute_paths(config, origins)
    _check_applies(config, origins)
    if check_paths:
        check_paths_exist(config, origins)
    return Resolved(config, origins)


def _check_renamed_value(key: str, value: Any, where: str) -> None:
    new = RENAMED_VALUES.get(key, {}).get(value) if isinstance(value, str) else None
    if new is not None:
        raise ConfigError(f"{where}: {key} {value!r} was renamed {new!r}; use that")


def _explain_validation(err: ValidationError, origins: Mapping[str, str]) -> str:
    lines = []
    for e in err.errors():
        loc = [str(p) for p in e.get("loc", ()) if not isinstance(p, int)]
        key = ".".join(loc[:2]) if loc else ""
        leaf = LEAVES.get(key)
        where = origins.get(key, PRESET_ORIGIN) if leaf else "config"
        msg = e.get("msg", "").replace("Value error, ", "")
        allowed = f" (one of {', '.join(leaf.choices())})" if leaf is not None and leaf.choices() else ""
        lines.append(f"{where}: {key or 'config'}: {msg}{allowed}" if key else f"config: {msg}")
    return "; ".join(lines)


def _absolute_paths(config: RunConfig, origins: Mapping[str, str]) -> RunConfig:
    """Path settings made absolute (against the current directory), so worker processes and a later --resume from
    elsewhere find the same files."""
    data = config.model_dump()
    changed = False
    for key, leaf in LEAVES.items():
        value = get_value(config, key)
        if (leaf.is_path or leaf.is_url) and isinstance(value, str):
            absolute = absolute_url(value)
            if absolute != value:
                data[leaf.section][leaf.name] = absolute  # type: ignore[index]
                changed = True
    return RunConfig.model_validate(data) if changed else config


def _check_applies(config: RunConfig, origins: Mapping[str, str]) -> None:
    """A model-only field given a value of its own by a file, variable or flag is refused when no diffusers pipeline
    is trained."""
    if config.model.model is not None:
        return
    given = [
        k
        for k in (f"model.{n}" for n in MODEL_ONLY_FIELDS)
        if origins.get(k, PRESET_ORIGIN) != PRESET_ORIGIN and get_value(config, k) != LEAVES[k].default
    ]  # a whole saved tree (config.yaml) names every field, at its default where it does not apply
    if given:
        where = ", ".join(f"{k} ({origins[k]})" for k in given)
        raise ConfigError(
            f"{where}: only for a diffusers pipeline; set model.model too (--model DIR, SPOTLIGHT_MODEL), or drop it"
        )


def check_paths_exist(config: RunConfig, origins: Mapping[str, str]) -> None:
    """ConfigError naming the first path setting (MUST_EXIST) that names nothing on this machine."""
    for key in MUST_EXIST:
        value = get_value(config, key)
        if value is not None and "://" not in value and not Path(value).exists():
            raise ConfigError(f"{origins.get(key, PRESET_ORIGIN)}: {key} {value}: no such file or folder")
