"""LocalTensorStore: the embedded default, a folder with atomic, durable writes."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

from resources.keys import check_key, check_prefix
from resources.store.base import ObjectNotFoundError, StoreError, StoreFullError, TensorStore

_TMP_PREFIX = ".tmp-"
_FULL = {
    errno.ENOSPC: "the disk is full",
    errno.EDQUOT: "the disk quota is used up",
    errno.EFBIG: "the file-size limit (ulimit -f) is reached",
}


class LocalTensorStore(TensorStore):
    """Objects are files under `root`; keys map to relative paths.

    Writes go to a hidden temp file in the target folder, are fsynced, then renamed into
    place (atomic on POSIX), so a reader never sees a partial object. Conditional create
    hard-links the finished temp file to the key: `link` fails if the key exists, which
    is the O_EXCL guarantee without ever exposing a half-written manifest. A write that
    fails (a full disk above all) removes its temp file and raises StoreFullError or
    StoreError: the key keeps its earlier bytes, or stays absent.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root).expanduser().resolve()
        self.fsync = fsync
        """fsync files and folders on write; off trades crash durability for speed."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise StoreError(f"cannot create store folder {self.root}: {err.strerror}") from err
        if not self.root.is_dir():
            raise StoreError(f"store path {self.root} exists and is not a folder")

    @property
    def url(self) -> str:
        return self.root.as_uri()

    def __repr__(self) -> str:
        return f"LocalTensorStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def put_bytes(self, key: str, data: bytes) -> None:
        path = self._path(key)
        with self._disk_errors(path, len(data)):
            tmp = self._write_temp(path, data)
            try:
                os.replace(tmp, path)
            except IsADirectoryError as err:
                raise ValueError(f"cannot write key {key!r}: it is already used as a prefix of other keys") from err
            finally:
                tmp.unlink(missing_ok=True)
            self._fsync_dir(path.parent)

    def create_exclusive(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        with self._disk_errors(path, len(data)):
            tmp = self._write_temp(path, data)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                tmp.unlink(missing_ok=True)
            self._fsync_dir(path.parent)
        return True

    def read_to_file(self, key: str, path: Path) -> None:
        with self.object_file(key) as source:
            shutil.copyfile(source, path)  # in chunks, never whole in memory

    @contextlib.contextmanager
    def object_file(self, key: str) -> Iterator[Path]:
        # The object's own file: objects are replaced by rename, never rewritten in place.
        path = self._path(key)
        if not path.is_file():
            raise ObjectNotFoundError(f"no object at {self.url}/{key}")
        yield path

    def get_bytes(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as err:
            raise ObjectNotFoundError(f"no object at {self.url}/{key}") from err

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list_keys(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        # Walk only the deepest folder the prefix names, then filter by the full prefix.
        base = self.root / prefix.rpartition("/")[0] if "/" in prefix else self.root
        keys = []
        for folder, dirs, files in os.walk(base):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            rel = Path(folder).relative_to(self.root).as_posix()
            for name in files:
                if not name.startswith("."):
                    key = name if rel == "." else f"{rel}/{name}"
                    if key.startswith(prefix):
                        keys.append(key)
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, IsADirectoryError):
            return
        self._prune_empty_parents(path.parent)

    def _write_temp(self, path: Path, data: bytes) -> Path:
        # A concurrent delete may prune the folder between mkdir and open: retry then.
        for _ in range(5):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError) as err:
                raise ValueError(f"cannot write {path}: a parent of this key is already an object") from err
            tmp = path.parent / f"{_TMP_PREFIX}{uuid.uuid4().hex}"
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            except FileNotFoundError:
                continue
            except NotADirectoryError as err:
                raise ValueError(f"cannot write {path}: a parent of this key is already an object") from err
            try:
                _write_all(fd, data)
                if self.fsync:
                    os.fsync(fd)
            except BaseException:
                tmp.unlink(missing_ok=True)  # a half-written temp file would only fill the disk further
                raise
            finally:
                os.close(fd)
            return tmp
        raise StoreError(f"could not create a temp file in {path.parent}: the folder keeps disappearing")

    @contextlib.contextmanager
    def _disk_errors(self, path: Path, size_bytes: int) -> Iterator[None]:
        """A full disk (or quota, or file-size limit) as one StoreFullError that says where and what to do."""
        try:
            yield
        except OSError as err:
            if err.errno not in _FULL:
                raise
            raise StoreFullError(
                err.errno,
                f"cannot write {size_bytes} bytes to {path}: {_FULL[err.errno]} ({err.strerror}). "
                f"Nothing partial was left and earlier commits are intact. Free space on the disk holding "
                f"{self.root} (or give the run another --store), then continue it with --resume.",
            ) from err

    def _fsync_dir(self, folder: Path) -> None:
        # The rename is durable only once the folder entry is on disk.
        if not self.fsync:
            return
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _prune_empty_parents(self, folder: Path) -> None:
        # Keeps the tree from filling with empty folders of deleted commits.
        while folder != self.root and self.root in folder.parents:
            try:
                folder.rmdir()
            except OSError as err:
                if err.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                    return
                raise
            folder = folder.parent


def _write_all(fd: int, data: bytes) -> None:
    """os.write until every byte is written (a write may be short, e.g. just before the disk fills)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
