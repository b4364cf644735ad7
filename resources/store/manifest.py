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
    def from_bytes(cls, data: bytes, where: str, commit_key: str | None = None) -> "Manifest":
        """Parse a manifest; `where` names it in the error when the bytes are not one.

        Raises ValueError for anything but a well-formed manifest whose objects all lie directly
        under its commit key, and (when `commit_key` is given: the key it was read from) whose
        commit key is that one. A publish deletes the objects of the manifest it replaces, so a
        damaged or crafted manifest must never name another commit's objects.
        """
        try:
            body = json.loads(data)
            if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
                raise ValueError(
                    f"format {body.get('format') if isinstance(body, dict) else None!r}, expected {MANIFEST_FORMAT!r}"
                )
            own_key = check_key(body["commit_key"])
            if commit_key is not None and own_key != commit_key:
                raise ValueError(f"it belongs to commit {own_key!r}, not {commit_key!r}")
            if not isinstance(body["objects"], dict) or not isinstance(body.get("metadata", {}), dict):
                raise ValueError("objects and metadata must be JSON objects")
            objects = {check_name(name, "object name"): _entry(own_key, o) for name, o in body["objects"].items()}
            if not isinstance(body["writer"], str):
                raise ValueError(f"writer must be a string, got {body['writer']!r:.40}")
            return cls(own_key, objects, body.get("metadata", {}), body["writer"])
        except RecursionError as err:
            raise ValueError(f"manifest {where} is not a valid spotlight manifest: nested too deeply") from err
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"manifest {where} is not a valid spotlight manifest: {err}") from err


def _entry(commit_key: str, raw: Any) -> ObjectEntry:
    """One object entry, refused unless its key is one segment directly under the commit key."""
    key, digest, size = raw["key"], raw["xxh3_128"], raw["size_bytes"]
    if not isinstance(key, str) or not key.startswith(commit_key + "/") or "/" in key[len(commit_key) + 1 :]:
        raise ValueError(f"object key {key!r:.80} does not lie directly under commit {commit_key!r}")
    check_key(key)
    if not isinstance(digest, str):
        raise ValueError(f"xxh3_128 must be a string, got {digest!r:.40}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"size_bytes must be an int >= 0, got {size!r:.40}")
    return ObjectEntry(key, digest, size)


def check_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    """Metadata must survive a JSON round trip unchanged (it is compared for idempotency)."""
    value = dict(metadata or {})
    try:
        if json.loads(json.dumps(value)) != value:
            raise TypeError("values change in a JSON round trip (use str keys, lists not tuples)")
    except TypeError as err:
        raise ValueError(
            f"commit metadata must be plain JSON (str keys; str/int/float/bool/list/dict values): {err}"
        ) from err
    return value
