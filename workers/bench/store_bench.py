"""Put/get throughput of a tensor store for small and large objects (`spotlight bench store`)."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import Iterator

from resources.store import open_store
from resources.store.base import TensorStore
from resources.store.local import LocalTensorStore


@dataclass(frozen=True)
class StoreBenchConfig:
    """Sizes and counts of the benchmark objects."""

    num_small: int = 200
    """Small objects per measurement (rollout states, manifests, results)."""
    small_bytes: int = 64 * 1024
    """Size of one small object."""
    num_large: int = 2
    """Large objects per measurement (anchors, checkpoints)."""
    large_bytes: int = 64 * 1024 * 1024
    """Size of one large object (above the S3 multipart threshold)."""

    def __post_init__(self) -> None:
        if min(self.num_small, self.small_bytes, self.num_large, self.large_bytes) < 1:
            raise ValueError("StoreBenchConfig counts and sizes must be >= 1")


def _timed_rows(store: TensorStore, backend: str, label: str, size: int, count: int) -> list[dict]:
    payloads = [os.urandom(size) for _ in range(min(count, 4))]  # random: nothing compresses
    prefix = f"bench/{uuid.uuid4().hex[:8]}/{label}"
    rows = []

    def row(op: str, mode: str, seconds: float) -> dict:
        return {
            "backend": backend,
            "objects": label,
            "object_bytes": size,
            "count": count,
            "op": op,
            "mode": mode,
            "seconds": round(seconds, 4),
            "MB_per_s": round(size * count / seconds / 1e6, 1),
            "objects_per_s": round(count / seconds, 1),
        }

    start = time.perf_counter()
    for i in range(count):
        store.put_bytes(f"{prefix}/raw/{i}", payloads[i % len(payloads)])
    rows.append(row("put", "raw", time.perf_counter() - start))
    start = time.perf_counter()
    for i in range(count):
        store.get_sized(f"{prefix}/raw/{i}", size)
    rows.append(row("get", "raw", time.perf_counter() - start))
    start = time.perf_counter()
    for i in range(count):
        store.publish(f"{prefix}/commit/{i}", {"blob": payloads[i % len(payloads)]})
    rows.append(row("put", "committed", time.perf_counter() - start))
    start = time.perf_counter()
    for i in range(count):
        store.load_bytes(f"{prefix}/commit/{i}", "blob")
    rows.append(row("get", "committed", time.perf_counter() - start))
    store.delete_keys(store.list_keys(prefix + "/"))
    return rows


def bench_store(store: TensorStore, backend: str, config: StoreBenchConfig = StoreBenchConfig()) -> list[dict]:
    """Raw put/get and publish/load (manifest + xxh3 verify) for small and large objects."""
    return _timed_rows(store, backend, "small", config.small_bytes, config.num_small) + _timed_rows(
        store, backend, "large", config.large_bytes, config.num_large
    )


@contextlib.contextmanager
def moto_store() -> Iterator[TensorStore]:
    """An S3TensorStore on an in-process moto server with throwaway credentials.

    It measures the client side (boto3, multipart, checksums) against a fake that shares
    this process's CPU; it says nothing about real S3 latency or bandwidth.
    """
    from moto.server import ThreadedMotoServer

    from resources.store.s3 import S3TensorStore

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        store = S3TensorStore("spotlight-bench", "bench", endpoint_url=f"http://{host}:{port}")
        store.client.create_bucket(Bucket="spotlight-bench")
        yield store
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_store_benchmarks(config: StoreBenchConfig, *, with_moto: bool, extra_url: str | None = None) -> list[dict]:
    """Local folder (a temp dir), optionally moto S3 and a user-given store URL."""
    if with_moto and importlib.util.find_spec("moto") is None:
        raise ValueError("the S3 benchmark needs moto[server] (pip install 'moto[server]'); or run with --no-s3")
    rows = []
    with tempfile.TemporaryDirectory(prefix="spotlight-bench-") as folder:
        rows += bench_store(LocalTensorStore(folder), "local", config)
        # The price of durability: every write fsyncs the file and its folder.
        rows += bench_store(LocalTensorStore(folder, fsync=False), "local (fsync off)", config)
    if with_moto:
        with moto_store() as store:
            rows += bench_store(store, "s3 (moto, in-process)", config)
    if extra_url:
        rows += bench_store(open_store(extra_url), extra_url, config)
    return rows
