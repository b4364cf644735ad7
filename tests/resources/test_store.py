"""The tensor-store contract, run against the local folder and S3 (moto), plus backend specifics."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from resources import keys
from resources.store import open_store
from resources.store.base import (
    ChecksumMismatchError,
    NotCommittedError,
    ObjectNotFoundError,
    StoreError,
    TensorStore,
)
from resources.store.local import LocalTensorStore
from resources.store.s3 import S3TensorStore
from tests.procs import ProcessLines
from tests.resources.s3_faults import S3FaultProxy


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest) -> TensorStore:
    if request.param == "local":
        return request.getfixturevalue("tmp_store")
    return request.getfixturevalue("s3_server").store()


# --- raw objects -------------------------------------------------------------------------


def test_bytes_roundtrip_and_exists(store: TensorStore) -> None:
    store.put_bytes("a/b/c.bin", b"\x00payload\xff")
    assert store.get_bytes("a/b/c.bin") == b"\x00payload\xff"
    assert store.exists("a/b/c.bin")
    assert not store.exists("a/b/other.bin")


def test_missing_key_raises_object_not_found(store: TensorStore) -> None:
    with pytest.raises(ObjectNotFoundError, match="no object at .*missing/key"):
        store.get_bytes("missing/key")


def test_put_replaces_an_existing_object(store: TensorStore) -> None:
    store.put_bytes("k", b"old")
    store.put_bytes("k", b"new")
    assert store.get_bytes("k") == b"new"


def test_list_keys_by_prefix_is_sorted_and_exact(store: TensorStore) -> None:
    for key in ["runs/a/x/2", "runs/a/x/1", "runs/ab/y", "runs/b/z"]:
        store.put_bytes(key, b"1")
    assert store.list_keys("runs/a/") == ["runs/a/x/1", "runs/a/x/2"]
    assert store.list_keys("runs/a") == ["runs/a/x/1", "runs/a/x/2", "runs/ab/y"]
    assert store.list_keys() == ["runs/a/x/1", "runs/a/x/2", "runs/ab/y", "runs/b/z"]
    assert store.list_keys("nothing/") == []


def test_delete_removes_and_tolerates_missing_keys(store: TensorStore) -> None:
    store.put_bytes("d/1", b"1")
    store.delete("d/1")
    store.delete("d/1")
    assert not store.exists("d/1")
    assert store.list_keys("d/") == []


@pytest.mark.parametrize("bad", ["../escape", "/absolute", "a//b", ".hidden/x", "a/", "", "sp ace"])
def test_invalid_keys_are_rejected_with_value_error(store: TensorStore, bad: str) -> None:
    with pytest.raises(ValueError, match="key"):
        store.put_bytes(bad, b"x")


def test_tensor_dict_roundtrip_is_bitwise_exact(store: TensorStore) -> None:
    tensors = {
        "w_bf16": torch.randn(3, 5).to(torch.bfloat16),
        "m_fp32": torch.randn(7),
        "idx": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "view": torch.randn(4, 4).t(),  # non-contiguous input is stored contiguously
    }
    store.put_tensors("t/dict.safetensors", tensors)
    loaded = store.get_tensors("t/dict.safetensors")
    assert loaded.keys() == tensors.keys()
    for name, value in tensors.items():
        assert loaded[name].dtype == value.dtype
        assert torch.equal(loaded[name], value)


# --- publish, then commit ----------------------------------------------------------------


def test_published_commit_loads_with_its_metadata(store: TensorStore) -> None:
    key = keys.patch_key("demo", 3)
    result = store.publish_tensors(key, {"v": torch.ones(4)}, metadata={"weights_hash": "ab12", "step": 3})
    assert result.won and result.identical
    assert torch.equal(store.load_tensors(key)["v"], torch.ones(4))
    assert store.read_manifest(key).metadata == {"weights_hash": "ab12", "step": 3}


def test_readers_trust_only_committed_manifests(store: TensorStore) -> None:
    store.put_bytes("runs/demo/patches/v000001/tensors.safetensors.0", b"data without manifest")
    assert store.read_manifest("runs/demo/patches/v000001") is None
    with pytest.raises(NotCommittedError, match="nothing is committed"):
        store.load_bytes("runs/demo/patches/v000001", "tensors.safetensors")


def test_republishing_the_same_content_is_idempotent(store: TensorStore) -> None:
    first = store.publish("c/1", {"a": b"alpha", "b": b"beta"}, metadata={"n": 1})
    keys_after_first = store.list_keys("c/1/")
    second = store.publish("c/1", {"a": b"alpha", "b": b"beta"}, metadata={"n": 1})
    assert second.won and first.manifest.same_content(second.manifest)
    assert store.list_keys("c/1/") == keys_after_first
    assert store.load_bytes("c/1", "a") == b"alpha"


def test_republishing_new_content_replaces_it_and_drops_superseded_objects(store: TensorStore) -> None:
    store.publish("state/r1", {"latents": b"step-4"}, metadata={"step": 4})
    store.publish("state/r1", {"latents": b"step-8"}, metadata={"step": 8})
    assert store.load_bytes("state/r1", "latents") == b"step-8"
    assert store.read_manifest("state/r1").metadata == {"step": 8}
    assert len(store.list_keys("state/r1/")) == 2  # the manifest and one data object


def test_corrupted_object_is_refused_with_a_clear_error(store: TensorStore) -> None:
    result = store.publish_tensors("w/v1", {"w": torch.randn(64)})
    entry = result.manifest.objects["tensors.safetensors"]
    corrupted = bytearray(store.get_bytes(entry.key))
    corrupted[-1] ^= 0x01  # one flipped bit in the tensor data
    store.put_bytes(entry.key, bytes(corrupted))
    with pytest.raises(ChecksumMismatchError, match=r"does not match its manifest.*xxh3-128.*Re-publish"):
        store.load_tensors("w/v1")


def test_missing_object_of_a_committed_manifest_is_reported(store: TensorStore) -> None:
    result = store.publish("m/1", {"x": b"x"})
    store.delete(result.manifest.objects["x"].key)
    with pytest.raises(StoreError, match="is missing"):
        store.load_bytes("m/1", "x")


def test_lost_commit_race_has_exactly_one_winner(store: TensorStore) -> None:
    num_writers = 8
    barrier = threading.Barrier(num_writers)
    results = [None] * num_writers

    def write(i: int) -> None:
        barrier.wait()
        results[i] = store.publish("race/result", {"r": f"writer-{i}".encode()}, exclusive=True)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(num_writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, r in enumerate(results) if r.won]
    assert len(winners) == 1
    assert store.load_bytes("race/result", "r") == f"writer-{winners[0]}".encode()
    assert all(r.manifest.writer == results[winners[0]].manifest.writer for r in results)
    assert not any(r.identical for r in results if not r.won)
    assert len(store.list_keys("race/result/")) == 2  # losers removed their data objects


def test_exclusive_publish_of_identical_content_loses_but_reports_identical(store: TensorStore) -> None:
    assert store.publish("dup/1", {"r": b"same"}, exclusive=True).won
    again = store.publish("dup/1", {"r": b"same"}, exclusive=True)
    assert not again.won and again.identical


def test_list_commits_finds_only_committed_keys(store: TensorStore) -> None:
    store.publish(keys.rollout_key("demo", 2, "req-b"), {"r": b"1"})
    store.publish(keys.rollout_key("demo", 2, "req-a"), {"r": b"2"})
    store.put_bytes(keys.rollout_key("demo", 2, "req-c") + "/r.0", b"uncommitted")
    store.publish(keys.rollout_key("demo", 3, "req-a"), {"r": b"3"})
    assert store.list_commits(keys.rollouts_prefix("demo", 2)) == [
        keys.rollout_key("demo", 2, "req-a"),
        keys.rollout_key("demo", 2, "req-b"),
    ]


def test_delete_commit_removes_manifest_and_objects(store: TensorStore) -> None:
    store.publish("gone/1", {"a": b"1", "b": b"2"})
    store.put_bytes("gone/1/stray.0", b"orphan of a lost race")
    store.delete_commit("gone/1")
    assert store.read_manifest("gone/1") is None
    assert store.list_keys("gone/") == []


# --- S3 specifics ------------------------------------------------------------------------


def test_large_object_is_uploaded_in_parts_and_verified(s3_server) -> None:
    mib = 1024 * 1024
    store = s3_server.store(multipart_threshold_bytes=5 * mib, multipart_chunksize_bytes=5 * mib)
    payload = torch.randint(0, 256, (12 * mib,), dtype=torch.uint8).numpy().tobytes()
    result = store.publish("big/1", {"blob": payload})
    head = s3_server.client().head_object(Bucket=s3_server.bucket, Key="store/" + result.manifest.objects["blob"].key)
    assert head["ETag"].strip('"').endswith("-3")  # S3's ETag of a 3-part multipart upload
    assert store.load_bytes("big/1", "blob") == payload


def test_transient_5xx_is_absorbed_by_the_retry(s3_server) -> None:
    with S3FaultProxy(s3_server.url) as proxy:
        proxy.inject("503", times=2)
        store = S3TensorStore(s3_server.bucket, "p", endpoint_url=proxy.url)
        store.publish("retry/1", {"x": b"survives"})
        assert store.load_bytes("retry/1", "x") == b"survives"
    assert proxy.injected["503"] == 2


def test_persistent_5xx_fails_with_a_store_error_after_retries(s3_server) -> None:
    from resources.store.s3 import S3Config

    with S3FaultProxy(s3_server.url) as proxy:
        proxy.inject("503", times=None)
        store = S3TensorStore(s3_server.bucket, "p", endpoint_url=proxy.url, config=S3Config(max_attempts=2))
        with pytest.raises(StoreError, match="S3 write of s3://.*/p/k failed after 2 attempts"):
            store.put_bytes("k", b"x")
    assert proxy.injected["503"] == 2 and proxy.forwarded == 0


def test_s3_store_takes_its_endpoint_from_the_environment(s3_server) -> None:
    store = open_store(f"s3://{s3_server.bucket}/runs-prefix")
    assert isinstance(store, S3TensorStore)
    assert store.endpoint_url == s3_server.url
    store.put_bytes("x", b"1")
    assert s3_server.client().get_object(Bucket=s3_server.bucket, Key="runs-prefix/x")["Body"].read() == b"1"


def test_missing_bucket_gives_an_actionable_error(s3_server) -> None:
    store = S3TensorStore("no-such-bucket-here", endpoint_url=s3_server.url)
    with pytest.raises(StoreError, match="bucket 'no-such-bucket-here' does not exist"):
        store.put_bytes("x", b"1")


# --- local specifics ---------------------------------------------------------------------


def test_local_writes_leave_no_temp_files(tmp_store: LocalTensorStore) -> None:
    for i in range(20):
        tmp_store.publish("r/1", {"s": str(i).encode()})
        tmp_store.publish("r/2", {"s": b"x"}, exclusive=True)
    hidden = [p for p in tmp_store.root.rglob(".*")]
    assert hidden == []


_RACER = """
import sys, time
from pathlib import Path
from resources.store.local import LocalTensorStore
root, writer = sys.argv[1], sys.argv[2]
store = LocalTensorStore(root)
print("polling", flush=True)
while not Path(root, "go").exists():
    time.sleep(0.001)
print(store.publish("race/p", {"r": writer.encode()}, exclusive=True).won)
"""


def test_lost_commit_race_across_processes_has_exactly_one_winner(tmp_path: Path) -> None:
    root = tmp_path / "store"
    with contextlib.ExitStack() as stack:
        racers = [
            stack.enter_context(
                ProcessLines(
                    subprocess.Popen(
                        [sys.executable, "-c", _RACER, str(root), str(i)],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                )
            )
            for i in range(4)
        ]
        for racer in racers:  # every racer is polling before the start: they really race
            racer.expect("polling", timeout_s=120)
        (root / "go").parent.mkdir(parents=True, exist_ok=True)
        (root / "go").touch()
        outcomes = [racer.finish(timeout_s=60)[0][-1] for racer in racers]
    assert sorted(outcomes) == ["False", "False", "False", "True"]
    assert LocalTensorStore(root).load_bytes("race/p", "r") == str(outcomes.index("True")).encode()


# --- URLs and keys -----------------------------------------------------------------------


def test_open_store_selects_the_backend_by_url(tmp_path: Path, s3_server) -> None:
    assert isinstance(open_store(tmp_path / "plain"), LocalTensorStore)
    file_store = open_store((tmp_path / "viafile").as_uri())
    assert isinstance(file_store, LocalTensorStore) and file_store.root == tmp_path / "viafile"
    assert isinstance(open_store(f"s3://{s3_server.bucket}"), S3TensorStore)


@pytest.mark.parametrize("url", ["gs://bucket/x", "redis://host", "http://example.com/store"])
def test_open_store_rejects_unknown_schemes_naming_the_supported_ones(url: str) -> None:
    with pytest.raises(ValueError, match=r"unsupported store URL scheme.*file:///.*s3://bucket/prefix"):
        open_store(url)


def test_open_store_never_echoes_credentials_from_a_url() -> None:
    with pytest.raises(ValueError) as info:
        open_store("s3://AKIAEXAMPLE:supersecret@bucket/prefix")
    assert "supersecret" not in str(info.value) and "AKIAEXAMPLE" not in str(info.value)


def test_keys_follow_the_documented_layout() -> None:
    assert keys.anchor_key("demo", 10) == "runs/demo/anchors/v000010"
    assert keys.patch_key("demo", 3) == "runs/demo/patches/v000003"
    assert keys.weights_key("demo", 3) == "runs/demo/weights/v000003"
    assert keys.rollout_key("demo", 12, "r-7") == "runs/demo/rollouts/it-000012/r-7"
    assert keys.rollout_state_key("demo", "r-7") == "runs/demo/rollout_state/r-7"
    assert keys.seed_plan_key("demo", 12) == "runs/demo/seed_plans/it-000012"
    assert keys.bandit_state_key("demo") == "runs/demo/bandit"
    assert keys.exploration_key("demo", 12) == "runs/demo/exploration/it-000012"
    assert keys.explore_result_key("demo", 12, "explore-it12-p3") == "runs/demo/explore/it-000012/explore-it12-p3"
    assert keys.iteration_label(12) == "it-000012"


@pytest.mark.parametrize(
    "call",
    [
        lambda: keys.patch_key("demo", 0),
        lambda: keys.rollout_key("demo", -1, "r"),
        lambda: keys.rollout_key("de/mo", 1, "r"),
        lambda: keys.rollout_state_key("demo", "../r"),
        lambda: keys.weights_key("demo", 10**6),
    ],
)
def test_key_functions_reject_bad_arguments(call) -> None:
    with pytest.raises(ValueError):
        call()


def test_store_benchmark_reports_every_operation_and_cleans_up(tmp_store: LocalTensorStore) -> None:
    from workers.bench.store_bench import StoreBenchConfig, bench_store

    rows = bench_store(
        tmp_store, "local", StoreBenchConfig(num_small=3, small_bytes=100, num_large=1, large_bytes=5000)
    )
    assert [(r["objects"], r["op"], r["mode"]) for r in rows][:4] == [
        ("small", "put", "raw"),
        ("small", "get", "raw"),
        ("small", "put", "committed"),
        ("small", "get", "committed"),
    ]
    assert len(rows) == 8 and all(r["objects_per_s"] > 0 and r["seconds"] >= 0 for r in rows)
    assert tmp_store.list_keys() == []
