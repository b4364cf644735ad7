"""Open a tensor store from its URL: a folder path, `file:///absolute/path`, or `s3://bucket/prefix`.

The store room: the interface (resources/store/base.py, re-exported here), the backends
(resources/store/local.py and resources/store/s3.py) and `open_store`, which picks one by URL.

Example:
    parse_store_url("s3://bucket/runs")                 # ("s3", "bucket", "runs"), nothing opened
    store = open_store("runs/demo/store")               # a LocalTensorStore
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from resources.store.base import (
    ChecksumMismatchError,
    ObjectNotFoundError,
    StoreError,
    StoreFullError,
    TensorStore,
)
from resources.store.local import LocalTensorStore
from resources.store.s3 import S3TensorStore  # boto3 is imported when the first S3 client is made
from resources.urls import is_plain_path

SUPPORTED_SCHEMES = "a folder path, file:///absolute/path, or s3://bucket/prefix"


def parse_store_url(url: str | Path) -> tuple[str, str, str]:
    """Check a store URL without touching anything: ("local", path, "") or ("s3", bucket, prefix)."""
    text = str(url)
    if not text:
        raise ValueError(f"store URL is empty: use {SUPPORTED_SCHEMES}")
    parsed = urlparse(text)
    scheme = parsed.scheme.lower()
    if is_plain_path(text, scheme):  # a plain (or Windows) path
        return "local", text, ""
    if scheme == "file":
        if parsed.netloc not in ("", "localhost") or parsed.query:
            raise ValueError(f"store URL {text!r}: a file URL must look like file:///absolute/path")
        return "local", parsed.path, ""
    if scheme == "s3":
        if parsed.username or parsed.password:
            # Do not echo the URL: it holds a secret.
            raise ValueError("an s3:// store URL must not contain credentials: configure them for boto3 instead")
        if parsed.query or parsed.fragment or not parsed.netloc:
            raise ValueError(
                f"store URL {text!r}: use s3://bucket/prefix only; set the endpoint with AWS_ENDPOINT_URL "
                "and credentials through boto3's standard configuration"
            )
        return "s3", parsed.netloc, parsed.path.strip("/")
    raise ValueError(f"unsupported store URL scheme {scheme!r} in {text!r}: use {SUPPORTED_SCHEMES}")


def open_store(url: str | Path) -> TensorStore:
    """Open a store from a URL: a folder path, `file:///abs/path`, or `s3://bucket/prefix`.

    S3 endpoint, region and credentials come from boto3's standard configuration
    (`AWS_ENDPOINT_URL`, `AWS_PROFILE`, `AWS_ACCESS_KEY_ID`, ...), never from the URL.
    """
    kind, location, prefix = parse_store_url(url)
    if kind == "local":
        return LocalTensorStore(location)
    return S3TensorStore(location, prefix)


def check_store_reachable(url: str | Path) -> None:
    """Reach an S3 store now (one small listing): StoreError naming the endpoint or bucket when it cannot be
    used. A local folder is created by the run itself, so nothing is touched for it."""
    kind, location, prefix = parse_store_url(url)
    if kind == "s3":
        S3TensorStore(location, prefix).check_reachable()


__all__ = [
    "ChecksumMismatchError",
    "LocalTensorStore",
    "ObjectNotFoundError",
    "S3TensorStore",
    "StoreError",
    "StoreFullError",
    "TensorStore",
    "check_store_reachable",
    "open_store",
    "parse_store_url",
]
