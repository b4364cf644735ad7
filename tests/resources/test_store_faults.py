"""Store faults: S3 errors injected between boto3 and moto, and a local store whose disk fills.

Transient faults must be absorbed (the same bytes as without faults); persistent ones must end
in one StoreError naming the key, the endpoint and the fault, with every earlier commit intact.
"""

from __future__ import annotations

import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Iterator

import pytest
import torch
from botocore.exceptions import EndpointConnectionError

from resources.store import local as store_local
from resources.store.base import ChecksumMismatchError, StoreError, StoreFullError
from resources.store.local import LocalTensorStore
from resources.store.s3 import S3Config, S3TensorStore
from tests.conftest import S3Endpoint, _free_port
from tests.resources.s3_faults import S3FaultProxy

MIB = 1024 * 1024


@pytest.fixture
def proxy(s3_server):
    with S3FaultProxy(s3_server.url) as running:
        yield running


def faulty_store(s3_server, proxy: S3FaultProxy, **config: object) -> S3TensorStore:
    """An S3 store that talks to moto through the proxy, with timeouts short enough for tests."""
    fields = {"connect_timeout_s": 1.0, "read_timeout_s": 1.0, "max_attempts": 4, **config}
    return S3TensorStore(s3_server.bucket, "p", endpoint_url=proxy.url, config=S3Config(**fields))


def _payload(seed: int, size: int) -> bytes:
    return (
        torch.randint(0, 256, (size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
        .numpy()
        .tobytes()
    )


# --- S3: transient faults are absorbed ------------------------------------------------------

TRANSIENT = [  # (kind, when, method): each hits the next two matching requests
    ("500", "before", None),
    ("503", "before", None),
    ("slowdown", "before", None),
    ("stall", "before", None),
    ("stall", "after", "PUT"),  # the PUT landed, its answer never came
    ("reset", "before", None),
    ("reset", "after", None),
    ("partial", "after", "GET"),
    ("corrupt", "after", "GET"),
]


@pytest.mark.parametrize(("kind", "when", "method"), TRANSIENT, ids=[f"{k}-{w}" for k, w, _ in TRANSIENT])
def test_transient_faults_are_absorbed_and_reads_return_the_fault_free_bytes(
    s3_server, proxy, kind, when, method
) -> None:
    store = faulty_store(s3_server, proxy)
    objects = {"a": _payload(1, 70_000), "b": b"small"}
    store.publish("c/1", objects, metadata={"step": 1})
    proxy.inject(kind, times=2, when=when, method=method, stall_s=1.5)
    store.publish("c/2", objects, metadata={"step": 2})
    loaded = {name: store.load_bytes(key, name) for key in ("c/1", "c/2") for name in objects}
    assert proxy.injected[kind] == 2  # the faults did hit
    assert loaded == objects
    assert store.read_manifest("c/2").metadata == {"step": 2}


def test_a_lost_answer_to_an_exclusive_commit_still_wins_it(s3_server, proxy) -> None:
    store = faulty_store(s3_server, proxy)
    proxy.inject("reset", times=1, when="after", method="PUT", path_contains="_MANIFEST.json")
    result = store.publish("race/r1", {"r": b"mine"}, exclusive=True)
    assert proxy.injected["reset"] == 1
    assert result.won and store.load_bytes("race/r1", "r") == b"mine"  # botocore re-sent it, got 412: that was us


def test_random_faults_on_every_request_leave_every_commit_exact(s3_server, proxy) -> None:
    store = faulty_store(s3_server, proxy, max_attempts=6)
    for kind, seed in [("500", 1), ("slowdown", 2), ("reset", 3), ("partial", 4)]:
        proxy.inject(kind, times=None, probability=0.08, seed=seed)
    expected = {f"r/{i}": _payload(i, 5_000 + i) for i in range(12)}
    for key, data in expected.items():
        store.publish(key, {"x": data})
    assert {key: store.load_bytes(key, "x") for key in expected} == expected
    assert sum(proxy.injected.values()) >= 4


def test_a_big_object_streams_through_broken_ranged_reads(s3_server, proxy, tmp_path) -> None:
    store = faulty_store(s3_server, proxy, multipart_threshold_bytes=5 * MIB, multipart_chunksize_bytes=5 * MIB)
    store.stream_threshold_bytes = MIB
    weights = {"w": torch.randn(3 * MIB)}  # 12 MiB: three ranged GETs, read to a file and checksummed there
    store.publish_tensors("anchors/v1", weights)
    proxy.inject("partial", times=2, method="GET", path_contains="tensors.safetensors")
    proxy.inject("503", times=1, method="GET", path_contains="tensors.safetensors")
    assert torch.equal(store.load_tensors("anchors/v1")["w"], weights["w"])
    assert proxy.injected["partial"] == 2 and proxy.injected["503"] == 1
    proxy.inject("partial", times=1, method="GET", path_contains="tensors.safetensors")
    store.load_to_file("anchors/v1", "tensors.safetensors", tmp_path / "anchor.safetensors")
    assert (tmp_path / "anchor.safetensors").read_bytes() == s3_server.client().get_object(
        Bucket=s3_server.bucket, Key="p/" + store.read_manifest("anchors/v1").objects["tensors.safetensors"].key
    )["Body"].read()


# --- S3: persistent faults stop with one clear error, nothing committed lost ------------------

PERSISTENT = [  # (kind, method, words the error must contain)
    ("500", None, "server error (InternalError 500"),
    ("slowdown", None, "kept throttling (SlowDown 503"),
    ("stall", None, "no answer within read_timeout_s=1 s"),
    ("reset", None, "closed or reset before an answer"),
    ("partial", "GET", "broke off before its end"),
]


@pytest.mark.parametrize(("kind", "method", "words"), PERSISTENT, ids=[k for k, _, _ in PERSISTENT])
def test_persistent_faults_fail_in_one_clear_error_and_keep_earlier_commits(
    s3_server, proxy, kind, method, words
) -> None:
    store = faulty_store(s3_server, proxy, max_attempts=2, read_attempts=2)
    store.publish("state/s1", {"latents": b"step-4"}, metadata={"step": 4})
    proxy.inject(kind, times=None, method=method, stall_s=1.5)
    started = time.monotonic()
    with pytest.raises(StoreError) as info:
        store.publish("state/s1", {"latents": b"step-8"}, metadata={"step": 8})
    assert time.monotonic() - started < 20  # bounded by attempts x timeouts: never a hang
    message = str(info.value)
    assert f"s3://{s3_server.bucket}/p/state/s1/" in message and proxy.url in message and words in message, message
    assert "--resume" in message
    proxy.clear()
    assert store.load_bytes("state/s1", "latents") == b"step-4"
    assert store.read_manifest("state/s1").metadata == {"step": 4}


def test_a_write_that_fails_midway_leaves_the_previous_commit_readable(s3_server, proxy) -> None:
    store = faulty_store(s3_server, proxy, max_attempts=2)
    store.publish("ckpt/w", {"a": b"a-1", "b": b"b-1"}, metadata={"v": 1})
    proxy.inject("500", times=None, method="PUT", path_contains="/b.")  # object a lands, b never does
    with pytest.raises(StoreError, match=r"S3 write of s3://.*/p/ckpt/w/b\.[0-9a-f]+ failed after 2 attempts"):
        store.publish("ckpt/w", {"a": b"a-2", "b": b"b-2"}, metadata={"v": 2})
    proxy.clear()
    assert [store.load_bytes("ckpt/w", n) for n in "ab"] == [b"a-1", b"b-1"]
    assert store.read_manifest("ckpt/w").metadata == {"v": 1}
    store.publish("ckpt/w", {"a": b"a-2", "b": b"b-2"}, metadata={"v": 2})  # a retry once healthy completes it
    assert [store.load_bytes("ckpt/w", n) for n in "ab"] == [b"a-2", b"b-2"]


def test_a_commit_whose_cleanup_fails_is_still_committed(s3_server, proxy) -> None:
    store = faulty_store(s3_server, proxy, max_attempts=2)
    store.publish("state/c1", {"latents": b"step-2"})
    proxy.inject("500", times=None, method="POST", path_contains="delete")  # DeleteObjects of the superseded object
    result = store.publish("state/c1", {"latents": b"step-4"})
    assert result.won and proxy.injected["500"] == 2
    proxy.clear()
    assert (
        store.load_bytes("state/c1", "latents") == b"step-4"
    )  # the leftover is unreferenced; delete_commit removes it
    store.delete_commit("state/c1")
    assert store.list_keys("state/c1/") == []


def test_a_multipart_upload_that_fails_in_a_part_publishes_nothing(s3_server, proxy) -> None:
    store = faulty_store(
        s3_server, proxy, max_attempts=2, multipart_threshold_bytes=5 * MIB, multipart_chunksize_bytes=5 * MIB
    )
    old = _payload(0, 6 * MIB)
    store.publish("big/b", {"blob": old})
    proxy.inject("503", times=None, method="PUT", path_contains="partNumber=2")
    with pytest.raises(StoreError, match=r"S3 write of s3://.*/p/big/b/blob\.[0-9a-f]+ failed"):
        store.publish("big/b", {"blob": _payload(1, 11 * MIB)})
    proxy.clear()
    assert store.load_bytes("big/b", "blob") == old
    uploads = s3_server.client().list_multipart_uploads(Bucket=s3_server.bucket).get("Uploads", [])
    assert uploads == []  # s3transfer aborted it: no parts left to pay for
    assert len(store.list_keys("big/b/")) == 2  # the manifest and the old object, nothing half-written


def test_an_object_that_reads_back_corrupt_every_time_is_refused(s3_server, proxy) -> None:
    store = faulty_store(s3_server, proxy, read_attempts=2)
    store.publish("w/v1", {"x": _payload(3, 10_000)})
    key = store.read_manifest("w/v1").objects["x"].key
    s3_server.client().put_object(
        Bucket=s3_server.bucket, Key="p/" + key, Body=b"tampered"
    )  # a valid S3 answer, wrong bytes
    with pytest.raises(ChecksumMismatchError, match=r"does not match its manifest.*read 2 times"):
        store.load_bytes("w/v1", "x")


# --- streaming reads of big objects -------------------------------------------------------------


def _peak_python_bytes(call) -> tuple[object, int]:
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.fixture
def s3_server_elsewhere(s3_server) -> Iterator[S3Endpoint]:
    """A moto server in its own process: tracemalloc then sees the client's memory only (the
    session's in-process server holds a whole copy of every body it sends)."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        endpoint = S3Endpoint(f"http://127.0.0.1:{port}", s3_server.bucket)
        deadline = time.monotonic() + 60
        while True:
            try:
                endpoint.client().create_bucket(Bucket=endpoint.bucket)
                break
            except EndpointConnectionError:
                assert server.poll() is None and time.monotonic() < deadline, "the moto server did not start"
                time.sleep(0.2)
        yield endpoint
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize("backend", ["local", "s3"])
def test_a_big_tensor_load_holds_only_the_tensors_not_a_copy_of_the_object(backend, tmp_store, request) -> None:
    store = tmp_store if backend == "local" else request.getfixturevalue("s3_server_elsewhere").store()
    weights = {"w": torch.randn(8 * MIB)}  # 32 MiB
    size = store.publish_tensors("anchors/v0", weights).manifest.objects["tensors.safetensors"].size_bytes
    whole, whole_peak = _peak_python_bytes(
        lambda: store.load_tensors("anchors/v0")
    )  # under the threshold: bytes, then tensors
    store.stream_threshold_bytes = MIB
    streamed, streamed_peak = _peak_python_bytes(lambda: store.load_tensors("anchors/v0"))
    assert torch.equal(streamed["w"], weights["w"]) and torch.equal(whole["w"], weights["w"])
    assert whole_peak > 1.9 * size  # the measurement sees a whole-object copy when there is one
    # The tensors' own memory (safetensors' pread buffers) and chunks: no second copy of the object.
    assert streamed_peak < 1.25 * size, f"peak {streamed_peak / MIB:.1f} MiB for a {size / MIB:.0f} MiB object"


def test_load_to_file_refuses_a_corrupt_object_and_leaves_the_target_alone(tmp_store, tmp_path) -> None:
    result = tmp_store.publish("w/v1", {"x": b"committed bytes"})
    target = tmp_path / "out.bin"
    target.write_bytes(b"what was here before")
    tmp_store.put_bytes(result.manifest.objects["x"].key, b"committed bytez")
    with pytest.raises(ChecksumMismatchError, match="does not match its manifest"):
        tmp_store.load_to_file("w/v1", "x", target)
    assert target.read_bytes() == b"what was here before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin", "store"]  # no partial file left


# --- local store: the disk fills -------------------------------------------------------------


class FullDisk:
    """A disk with `free_bytes` left: writes past it write what fits, then fail ENOSPC (as the kernel does)."""

    def __init__(self, free_bytes: int) -> None:
        self.free_bytes = free_bytes
        self.real_write_all = store_local._write_all

    def write_all(self, fd: int, data: bytes) -> None:
        fits = min(len(data), self.free_bytes)
        self.real_write_all(fd, data[:fits])
        self.free_bytes -= fits
        if fits < len(data):
            raise OSError(28, "No space left on device")


def _hidden_files(store: LocalTensorStore) -> list[Path]:
    return [p for p in store.root.rglob(".*")]


def test_a_full_disk_stops_the_write_with_a_clear_error_and_keeps_earlier_commits(tmp_store, monkeypatch) -> None:
    tmp_store.publish("runs/demo/weights/v000001", {"w": b"w" * 1000}, metadata={"v": 1})
    disk = FullDisk(free_bytes=1500)  # the next object's first half fits, then the disk is full
    monkeypatch.setattr(store_local, "_write_all", disk.write_all)
    with pytest.raises(StoreFullError) as info:
        tmp_store.publish("runs/demo/weights/v000001", {"w": b"W" * 3000}, metadata={"v": 2})
    message = str(info.value)
    assert "the disk is full" in message and str(tmp_store.root / "runs/demo/weights/v000001") in message
    assert "Free space" in message and "--resume" in message and info.value.errno == 28
    assert tmp_store.load_bytes("runs/demo/weights/v000001", "w") == b"w" * 1000
    assert tmp_store.read_manifest("runs/demo/weights/v000001").metadata == {"v": 1}
    assert _hidden_files(tmp_store) == []  # the half-written temp file was removed
    assert len(tmp_store.list_keys("runs/demo/weights/v000001/")) == 2
    disk.free_bytes = 10**6  # space freed: the same publish now completes
    tmp_store.publish("runs/demo/weights/v000001", {"w": b"W" * 3000}, metadata={"v": 2})
    assert tmp_store.load_bytes("runs/demo/weights/v000001", "w") == b"W" * 3000


def test_a_disk_that_fills_at_the_manifest_leaves_the_commit_absent_not_broken(tmp_store, monkeypatch) -> None:
    disk = FullDisk(free_bytes=100)  # the object fits, its manifest does not
    monkeypatch.setattr(store_local, "_write_all", disk.write_all)
    with pytest.raises(StoreFullError, match="_MANIFEST.json"):
        tmp_store.publish("runs/demo/rollouts/it-000001/r1", {"r": b"x" * 80}, exclusive=True)
    assert tmp_store.read_manifest("runs/demo/rollouts/it-000001/r1") is None
    assert tmp_store.list_commits() == [] and _hidden_files(tmp_store) == []
    disk.free_bytes = 10**6
    assert tmp_store.publish("runs/demo/rollouts/it-000001/r1", {"r": b"x" * 80}, exclusive=True).won


_FSIZE_WRITER = """
import resource, signal, sys
from resources.store.base import StoreError
from resources.store.local import LocalTensorStore
store = LocalTensorStore(sys.argv[1])
store.publish("ckpt/a", {"x": b"1" * 1000})
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # then the kernel answers EFBIG instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    store.publish("ckpt/a", {"x": b"2" * 200_000})
except StoreError as err:
    print(type(err).__name__, err)
"""


def test_a_real_file_size_limit_is_reported_and_leaves_nothing_partial(tmp_path) -> None:
    root = tmp_path / "store"
    done = subprocess.run([sys.executable, "-c", _FSIZE_WRITER, str(root)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout.startswith("StoreFullError")
        and "file-size limit" in done.stdout
        and str(root / "ckpt/a") in done.stdout
    )
    store = LocalTensorStore(root)
    assert store.load_bytes("ckpt/a", "x") == b"1" * 1000
    assert _hidden_files(store) == [] and len(store.list_keys("ckpt/a/")) == 2


# --- a whole run through the faulty proxy -------------------------------------------------------


@pytest.mark.nightly
@pytest.mark.slow
def test_a_run_on_s3_completes_through_random_faults_and_commits_only_whole_objects(s3_server, proxy, tmp_path) -> None:
    import os

    for kind, seed in [("500", 1), ("slowdown", 2), ("reset", 3), ("partial", 4), ("corrupt", 5)]:
        proxy.inject(kind, times=None, probability=0.03, seed=seed)
    store_url = f"s3://{s3_server.bucket}/spotlight"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines",
            "run",
            "--preset",
            "cpu_smoke",
            "--iterations",
            "1",
            "--rollouts",
            "inprocess",
            "--store",
            store_url,
            "--run-dir",
            str(tmp_path / "faulty"),
        ],
        cwd=tmp_path,
        env={**os.environ, "AWS_ENDPOINT_URL": proxy.url, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "it   0" in done.stdout + done.stderr
    assert sum(proxy.injected.values()) >= 5, proxy.injected  # the run did meet faults
    proxy.clear()
    store = S3TensorStore(s3_server.bucket, "spotlight", endpoint_url=s3_server.url)  # straight to moto
    commits = store.list_commits("runs/faulty/")
    assert any("/anchors/" in c for c in commits) and any("/patches/" in c for c in commits), commits
    for commit in commits:  # every committed object is whole and matches its manifest
        for name in store.read_manifest(commit).objects:
            store.load_bytes(commit, name)
