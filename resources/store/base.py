"""The tensor store interface: raw objects, tensor dicts, and publish-then-commit with checksums.

A backend implements six primitives (`put_bytes`, `get_bytes`, `exists`, `list_keys`,
`delete`, `create_exclusive`); everything else is shared here so both backends behave
identically under one contract test suite.

Publish, then commit: `publish(commit_key, {name: bytes})` writes each object under a
content-addressed key (`{commit_key}/{name}.{xxh3}`), then the manifest
`{commit_key}/_MANIFEST.json` last. Readers (`load_bytes`, `load_tensors`) trust only a
committed manifest and verify size and checksum of every object they read. With
`exclusive=True` the manifest is created only if absent (exactly one writer wins a race);
otherwise it replaces the previous manifest, whose superseded objects are then deleted.
That assumes one writer per commit key at a time: a queue lease does not ensure it (an
expired lease leaves two holders), so a request's in-flight state is committed under a
key per attempt (workers/rollout/resume.py), and readers that can afford to lose the
state treat any StoreError or ValueError on read as "no usable state".

Reads are verified and, for big objects, streamed: `load_tensors` of an object of at least
`stream_threshold_bytes` (anchors, checkpoints) checksums a file (the local store's own,
or a temporary download) in chunks and loads the tensors from it, so the object's bytes are
never held in memory beside its tensors; `load_to_file` streams any committed object into a
file. A read whose bytes do not match the manifest is retried `read_attempts` times (a
short or damaged answer from the network) before ChecksumMismatchError. Faults and what the
store does about them: docs/FAULTS.md ("Store faults").

Backends: resources/store/local.py and resources/store/s3.py; `open_store` (resources/store/__init__.py)
picks one by URL.

Example:
    store = open_store("file:///tmp/spotlight-store")     # or "s3://bucket/prefix"
    store.publish_tensors(patch_key("demo", 3), {"values": t}, metadata={"hash": h})
    tensors = store.load_tensors(patch_key("demo", 3))
"""

from __future__ import annotations

import abc
import contextlib
import logging
import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, TypeVar

from resources.keys import MANIFEST_NAME, check_key
from resources.store.manifest import Manifest, ObjectEntry, check_metadata, checksum, manifest_key, object_key
from resources.store.tensors import tensors_from_bytes, tensors_from_file, tensors_to_bytes

if TYPE_CHECKING:
    import torch

TENSORS_NAME = "tensors.safetensors"
_CHUNK_BYTES = 8 * 1024 * 1024
log = logging.getLogger("spotlight.store")
T = TypeVar("T")


class StoreError(Exception):
    """A store operation failed in a way the caller cannot fix by changing arguments."""


class ObjectNotFoundError(StoreError, LookupError):
    """The key does not exist."""


class NotCommittedError(ObjectNotFoundError):
    """No committed manifest exists under the commit key (nothing published yet, or deleted)."""


class ChecksumMismatchError(StoreError):
    """An object's bytes differ from its manifest: modified after commit or corrupted."""


class StoreFullError(StoreError):
    """A write found no space (disk full, quota, file-size limit); nothing partial was left behind."""

    def __init__(self, errno: int, message: str) -> None:
        super().__init__(message)
        self.errno = errno
        """The OS error number (ENOSPC, EDQUOT or EFBIG)."""


@dataclass(frozen=True)
class PublishResult:
    """Outcome of `publish`: the manifest committed now, and whether it is this call's."""

    manifest: Manifest
    """The committed manifest (this call's, or the winner's when an exclusive publish lost)."""
    won: bool
    """True when this call's manifest is the committed one."""
    identical: bool
    """True when the committed content equals what this call published (always when won)."""


class TensorStore(abc.ABC):
    """A key -> bytes store with tensor dicts and checksummed publish-then-commit."""

    read_attempts: int = 1
    """Reads of one object before its bytes are declared not to match the manifest (a network
    backend re-reads: the first answer may have been short or damaged in transit)."""
    stream_threshold_bytes: int = 64 * 1024 * 1024
    """`load_tensors` of an object at least this large goes through a file, not a bytes copy."""

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """URL that `open_store` turns back into an equivalent store (no credentials)."""

    @abc.abstractmethod
    def put_bytes(self, key: str, data: bytes) -> None:
        """Write (or replace) one object atomically: readers see the old or the new bytes."""

    @abc.abstractmethod
    def get_bytes(self, key: str) -> bytes:
        """Read one object; raise ObjectNotFoundError if it does not exist."""

    @abc.abstractmethod
    def exists(self, key: str) -> bool:
        """True if an object exists at exactly this key."""

    @abc.abstractmethod
    def list_keys(self, prefix: str = "") -> list[str]:
        """All object keys starting with `prefix` (plain string prefix), sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete one object; deleting a missing key is not an error."""

    @abc.abstractmethod
    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Create the object only if absent, atomically; True if this call created it."""

    def get_sized(self, key: str, size_bytes: int) -> bytes:
        """Read an object whose size is known (backends may use ranged parallel reads)."""
        return self.get_bytes(key)

    def read_to_file(self, key: str, path: Path) -> None:
        """Write one object's bytes to the file `path` (created or replaced); backends stream it.
        ObjectNotFoundError if the object does not exist."""
        path.write_bytes(self.get_bytes(key))

    @contextlib.contextmanager
    def object_file(self, key: str) -> Iterator[Path]:
        """A file holding the object's bytes while the block runs: a temporary download here, the
        backend's own file where it has one (never write to it)."""
        with tempfile.TemporaryDirectory(prefix="spotlight-read-") as folder:
            path = Path(folder) / "object"
            self.read_to_file(key, path)
            yield path

    def delete_keys(self, keys: Iterable[str]) -> None:
        """Delete many objects (backends may batch)."""
        for key in keys:
            self.delete(key)

    def put_tensors(self, key: str, tensors: Mapping[str, "torch.Tensor"]) -> None:
        """Write a tensor dict as safetensors bytes (no manifest; see `publish_tensors`)."""
        self.put_bytes(key, tensors_to_bytes(tensors))

    def get_tensors(self, key: str) -> dict[str, "torch.Tensor"]:
        """Read a tensor dict written by `put_tensors`."""
        return tensors_from_bytes(self.get_bytes(key))

    def read_manifest(self, commit_key: str) -> Manifest | None:
        """The committed manifest of `commit_key`, or None when nothing is committed."""
        key = manifest_key(commit_key)
        try:
            data = self.get_bytes(key)
        except ObjectNotFoundError:
            return None
        return Manifest.from_bytes(data, where=self._where(key), commit_key=commit_key)

    def publish(
        self,
        commit_key: str,
        objects: Mapping[str, bytes],
        metadata: Mapping[str, Any] | None = None,
        *,
        exclusive: bool = False,
    ) -> PublishResult:
        """Write `objects`, then commit them with a manifest (see the module docstring)."""
        if not objects:
            raise ValueError(f"publish to {commit_key!r} needs at least one object")
        entries = {}
        for name, data in objects.items():
            digest = checksum(data)
            entries[name] = ObjectEntry(object_key(commit_key, name, digest), digest, len(data))
        manifest = Manifest(commit_key, entries, check_metadata(metadata))
        previous = self.read_manifest(commit_key)
        if exclusive and previous is not None:
            return PublishResult(previous, won=False, identical=previous.same_content(manifest))
        already = {e.key for e in previous.objects.values()} if previous else set()
        for name, entry in entries.items():
            if entry.key not in already:  # content-addressed: same key means same bytes
                self.put_bytes(entry.key, objects[name])
        if exclusive:
            return self._commit_exclusive(manifest)
        self.put_bytes(manifest_key(commit_key), manifest.to_bytes())
        if previous is not None:
            keep = {e.key for e in entries.values()}
            try:
                self.delete_keys(e.key for e in previous.objects.values() if e.key not in keep)
            except StoreError as err:
                # Committed already: the leftovers are unreferenced, and delete_commit removes them.
                log.warning(
                    "commit %s landed but its superseded objects were not deleted: %s", self._where(commit_key), err
                )
        return PublishResult(manifest, won=True, identical=True)

    def _commit_exclusive(self, manifest: Manifest) -> PublishResult:
        key = manifest_key(manifest.commit_key)
        if self.create_exclusive(key, manifest.to_bytes()):
            return PublishResult(manifest, won=True, identical=True)
        committed = self.read_manifest(manifest.commit_key)
        if committed is None:
            raise StoreError(
                f"commit {self._where(key)} was taken by another writer and then deleted; retry the publish"
            )
        if committed.writer == manifest.writer:
            # A retried request whose first attempt had already landed: that was us.
            return PublishResult(committed, won=True, identical=True)
        winner_keys = {e.key for e in committed.objects.values()}
        self.delete_keys(e.key for e in manifest.objects.values() if e.key not in winner_keys)
        return PublishResult(committed, won=False, identical=committed.same_content(manifest))

    def publish_tensors(
        self,
        commit_key: str,
        tensors: Mapping[str, "torch.Tensor"],
        metadata: Mapping[str, Any] | None = None,
        *,
        exclusive: bool = False,
    ) -> PublishResult:
        """Publish one tensor dict as the commit's `tensors.safetensors` object."""
        return self.publish(commit_key, {TENSORS_NAME: tensors_to_bytes(tensors)}, metadata, exclusive=exclusive)

    def load_bytes(self, commit_key: str, name: str) -> bytes:
        """Read one object of a committed manifest, verifying its size and checksum."""
        return self._read_committed(commit_key, name, lambda entry: self._read_verified(entry, name))

    def load_to_file(self, commit_key: str, name: str, path: str | os.PathLike[str]) -> ObjectEntry:
        """Stream one object of a committed manifest into the file `path`, never whole in memory.

        The bytes go to a hidden file beside `path`, are verified (size and checksum), and only
        then renamed to `path`: `path` holds the committed bytes or is left as it was.
        Returns the manifest entry that was read.
        """
        target = Path(path)
        partial = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.part")

        def read(entry: ObjectEntry) -> ObjectEntry:
            try:
                for attempt in range(1, self.read_attempts + 1):
                    self.read_to_file(entry.key, partial)
                    if self._matches(entry, name, partial, attempt):
                        os.replace(partial, target)
                        return entry
            finally:
                partial.unlink(missing_ok=True)
            raise AssertionError("unreachable: the last attempt returns or raises")

        return self._read_committed(commit_key, name, read)

    def _read_committed(self, commit_key: str, name: str, read: Callable[[ObjectEntry], T]) -> T:
        manifest = self._require_manifest(commit_key)
        for _ in range(3):
            entry = manifest.objects.get(name)
            if entry is None:
                raise ObjectNotFoundError(
                    f"commit {self._where(commit_key)} has no object {name!r}; it has {sorted(manifest.objects)}"
                )
            try:
                return read(entry)
            except ObjectNotFoundError:
                # The commit may have been replaced between reading its manifest and its object.
                newer = self._require_manifest(commit_key)
                if newer.objects.get(name) == entry:
                    break
                manifest = newer
        raise StoreError(
            f"object {self._where(entry.key)} named by the manifest of {commit_key!r} is missing: "
            "it was deleted outside the store API or the store is damaged; re-publish the commit"
        )

    def load_from(self, manifest: Manifest, name: str = TENSORS_NAME) -> bytes:
        """Read one object of a manifest read earlier, verifying its size and checksum: the bytes and
        that manifest's metadata then belong to one commit even while another writer replaces it.
        ObjectNotFoundError when the object is gone (the commit was replaced or deleted since)."""
        entry = manifest.objects.get(name)
        if entry is None:
            raise ObjectNotFoundError(
                f"commit {self._where(manifest.commit_key)} has no object {name!r}; it has {sorted(manifest.objects)}"
            )
        return self._read_verified(entry, name)

    def load_tensors(self, commit_key: str, name: str = TENSORS_NAME) -> dict[str, "torch.Tensor"]:
        """Read and verify a committed tensor dict; a big one streams through a file (module docstring)."""
        return self._read_committed(commit_key, name, lambda entry: self._tensors_verified(entry, name))

    def _tensors_verified(self, entry: ObjectEntry, name: str) -> dict[str, "torch.Tensor"]:
        if entry.size_bytes < self.stream_threshold_bytes:
            return tensors_from_bytes(self._read_verified(entry, name))
        for attempt in range(1, self.read_attempts + 1):
            with self.object_file(entry.key) as path:
                if self._matches(entry, name, path, attempt):
                    return tensors_from_file(path)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _read_verified(self, entry: ObjectEntry, name: str) -> bytes:
        """The object's bytes, re-read up to `read_attempts` times while they do not match the manifest."""
        for attempt in range(1, self.read_attempts + 1):
            data = self.get_sized(entry.key, entry.size_bytes)
            if self._matches(entry, name, data, attempt):
                return data
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _matches(self, entry: ObjectEntry, name: str, data: bytes | Path, attempt: int) -> bool:
        """True when `data` (bytes, or a file) is the entry's; False to read again; on the last
        attempt ChecksumMismatchError."""
        size, digest = _file_checksum(data) if isinstance(data, Path) else (len(data), checksum(data))
        if size == entry.size_bytes and digest == entry.xxh3_128:
            return True
        if attempt < self.read_attempts:
            log.warning(
                "read of %s returned %d bytes with xxh3-128 %s, not the manifest's; reading it again",
                self._where(entry.key),
                size,
                digest,
            )
            return False
        raise ChecksumMismatchError(
            f"object {name!r} at {self._where(entry.key)} does not match its manifest: "
            f"expected {entry.size_bytes} bytes with xxh3-128 {entry.xxh3_128}, "
            f"read {size} bytes with xxh3-128 {digest}{_times(attempt)}. It was modified after commit "
            "or corrupted; refusing to use it. Re-publish the commit."
        )

    def list_commits(self, prefix: str = "") -> list[str]:
        """Commit keys under `prefix` that have a committed manifest, sorted."""
        suffix = "/" + MANIFEST_NAME
        return sorted(k[: -len(suffix)] for k in self.list_keys(prefix) if k.endswith(suffix))

    def delete_commit(self, commit_key: str) -> None:
        """Uncommit first (delete the manifest), then every object under the commit key."""
        self.delete(manifest_key(commit_key))
        self.delete_keys(self.list_keys(check_key(commit_key) + "/"))

    def _require_manifest(self, commit_key: str) -> Manifest:
        manifest = self.read_manifest(commit_key)
        if manifest is None:
            raise NotCommittedError(f"nothing is committed at {self._where(commit_key)} (no {MANIFEST_NAME})")
        return manifest

    def _where(self, key: str) -> str:
        return f"{self.url.rstrip('/')}/{key}"


def _file_checksum(path: Path) -> tuple[int, str]:
    """(size, xxh3-128 hex) of a file, read in chunks: the same digest as `checksum` of its bytes."""
    import xxhash

    digest, size = xxhash.xxh3_128(), 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _times(attempts: int) -> str:
    return f" (read {attempts} times)" if attempts > 1 else ""
