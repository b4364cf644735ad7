"""The commit manifest: which content-addressed objects make up a commit, with xxh3 checksums."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

import xxhash

from resources.keys import MANIFEST_NAME, check_key, check_name

MANIFEST_FORMAT = "spotlight-manifest/1"


def checksum(data: bytes) -> str:
    """xxh3-128 hex digest: fast enough to hash every object on every read (~10+ GB/s)."""
    return xxhash.xxh3_128_hexdigest(data)


def manifest_key(commit_key: str) -> str:
    """Where the manifest of a commit lives."""
    return f"{check_key(commit_key)}/{MANIFEST_NAME}"


def object_key(commit_key: str, name: str, digest: str) -> str:
    """Content-addressed location of one data object: a racing writer with other bytes
    writes elsewhere and so can never clobber the object a committed manifest names."""
    return f"{commit_key}/{check_name(name, 'object name')}.{digest}"


@dataclass(frozen=True)
class ObjectEntry:
    """One data object listed in a manifest."""

    key: str
    """Store key of the content-addressed object."""
    xxh3_128: str
    """Hex checksum the bytes must match on read."""
    size_bytes: int
    """Exact length in bytes."""


@dataclass(frozen=True)
class Manifest:
    """A committed set of named objects under one commit key."""

    commit_key: str
    """The commit this manifest belongs to."""
    objects: Mapping[str, ObjectEntry]
    """Object name -> entry."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """Small JSON-serialisable facts about the commit (step index, weights hash, ...)."""
    writer: str = field(default_factory=lambda: uuid.uuid4().hex)
    """Token of the publish call that wrote it: tells a retried conditional write that
    the earlier attempt was its own."""

    def same_content(self, other: "Manifest") -> bool:
        """True when both name the same bytes and metadata (the writer may differ)."""
        return dict(self.objects) == dict(other.objects) and dict(self.metadata) == dict(other.metadata)

    def to_bytes(self) -> bytes:
        body = {
            "format": MANIFEST_FORMAT,
            "commit_key": self.commit_key,
            "writer": self.writer,
            "metadata": dict(self.metadata),
            "objects": {
                name: {"key": e.key, "xxh3_128": e.xxh3_128, "size_bytes": e.size_bytes}
                for name, e in sorted(self.objects.items())
            },
        }
        return json.dumps(body, sort_keys=True, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "Manifest":
        """Parse a manifest; `where` names it in the error when the bytes are not one."""
        try:
            body = json.loads(data)
            if body.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"format {body.get('format')!r}, expected {MANIFEST_FORMAT!r}")
            objects = {
                name: ObjectEntry(o["key"], o["xxh3_128"], int(o["size_bytes"]))
                for name, o in body["objects"].items()
            }
            return cls(body["commit_key"], objects, body.get("metadata", {}), body["writer"])
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"manifest {where} is not a valid spotlight manifest: {err}") from err


def check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """Metadata must survive a JSON round trip unchanged (it is compared for idempotency)."""
    value = dict(metadata or {})
    try:
        if json.loads(json.dumps(value)) != value:
            raise TypeError("values change in a JSON round trip (use str keys, lists not tuples)")
    except TypeError as err:
        raise ValueError(f"commit metadata must be plain JSON (str keys; str/int/float/bool/list/dict values): {err}") from err
    return value
