"""Every leaf of the config tree with the names it goes by: dotted key, flag, SPOTLIGHT_* variable.

Derived from resources/settings/config.py, never declared again: the CLI's options (pipelines/settings_cli.py), the
file and variable layers (resources/settings/resolve.py) and the Dagster launchpad's schema
(resources/dagster_resources.py) all walk `LEAVES`.

Example:
    LEAVES["train.group_size"].flag, LEAVES["train.group_size"].env   # "--group-size", "SPOTLIGHT_GROUP_SIZE"
    BY_NAME["group_size"].key                                          # "train.group_size"
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Optional

from pydantic.fields import FieldInfo

from resources.settings.config import SECTIONS, RunConfig


@dataclass(frozen=True)
class Leaf:
    """One setting of the tree."""

    section: Optional[str]
    """Its section ("train", ...); None for the top-level `preset`."""
    name: str
    """The field's name: unique across sections, so also its flat file key."""
    info: FieldInfo

    @property
    def key(self) -> str:
        """The dotted key: `train.group_size` (`preset` at the top)."""
        return f"{self.section}.{self.name}" if self.section else self.name

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "SPOTLIGHT_" + self.name.upper()

    @property
    def annotation(self) -> Any:
        return self.info.annotation

    @property
    def default(self) -> Any:
        return self.info.get_default(call_default_factory=True)

    @property
    def help(self) -> str:
        return self.info.description or ""

    @property
    def is_path(self) -> bool:
        extra = self.info.json_schema_extra
        return isinstance(extra, dict) and bool(extra.get("path"))

    @property
    def is_url(self) -> bool:
        extra = self.info.json_schema_extra
        return isinstance(extra, dict) and bool(extra.get("url"))

    @property
    def inner(self) -> Any:
        """The type without Optional."""
        annotation = self.annotation
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            return args[0] if len(args) == 1 else annotation
        return annotation

    @property
    def optional(self) -> bool:
        return type(None) in typing.get_args(self.annotation)

    def choices(self) -> tuple[str, ...]:
        """The allowed names of a Literal field (empty for any other type)."""
        return typing.get_args(self.inner) if typing.get_origin(self.inner) is Literal else ()

    def bounds(self) -> dict[str, Any]:
        """pydantic's bounds of the field (ge, gt, le, lt)."""
        out = {}
        for meta in self.info.metadata:
            for kind in ("ge", "gt", "le", "lt"):
                value = getattr(meta, kind, None)
                if value is not None:
                    out[kind] = value
        return out


def _leaves() -> dict[str, Leaf]:
    leaves = {"preset": Leaf(None, "preset", RunConfig.model_fields["preset"])}
    for section, model in SECTIONS.items():
        for name, info in model.model_fields.items():
            leaf = Leaf(section, name, info)
            leaves[leaf.key] = leaf
    return leaves


LEAVES: dict[str, Leaf] = _leaves()
"""Dotted key -> leaf, in the tree's order."""
BY_NAME: dict[str, Leaf] = {leaf.name: leaf for leaf in LEAVES.values()}
"""Field name (= flat file key) -> leaf."""
assert len(BY_NAME) == len(LEAVES), "field names must be unique across sections: each is a flag and a flat key"
