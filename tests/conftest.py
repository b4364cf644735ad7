"""Shared pytest fixtures: stores (local folder, S3 on a moto server), a redis-server, ledgers."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

_DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@dataclass(frozen=True)
class S3Endpoint:
    """A running S3-compatible endpoint with a fresh, empty bucket for one test."""

    url: str
    """http://127.0.0.1:PORT of the moto server."""
    bucket: str
    """A bucket created for this test only."""

    def store(self, prefix: str = "store", **config_fields: object):
        """An S3TensorStore on this bucket; keyword arguments become S3Config fields."""
        from resources.store.s3 import S3Config, S3TensorStore

        return S3TensorStore(self.bucket, prefix, endpoint_url=self.url, config=S3Config(**config_fields))

    def client(self):
        """A plain boto3 client on the endpoint, for inspecting what the store wrote."""
        import boto3

        return boto3.client("s3", endpoint_url=self.url)


@pytest.fixture(scope="session")
def _moto_url() -> Iterator[str]:
    """One moto S3 server (a real HTTP endpoint on 127.0.0.1, free port) per test session."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_server(_moto_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> S3Endpoint:
    """Dummy credentials and AWS_ENDPOINT_URL in the environment, ~/.aws hidden, a new bucket."""
    for name, value in _DUMMY_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    # Never let a developer's real configuration reach the tests.
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", _moto_url)
    bucket = f"spotlight-{uuid.uuid4().hex[:12]}"
    endpoint = S3Endpoint(_moto_url, bucket)
    endpoint.client().create_bucket(Bucket=bucket)
    return endpoint


@dataclass(frozen=True)
class RedisServer:
    """A redis-server on 127.0.0.1 that requires a password and never writes to disk."""

    port: int
    password: str

    def url(self, password: str | None = None, db: int = 0) -> str:
        auth = f":{password}@" if password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def flush(self) -> None:
        import redis

        with redis.Redis(port=self.port, password=self.password) as client:
            client.flushall()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_redis(binary: str, password: str, folder: Path) -> tuple[RedisServer, subprocess.Popen]:
    """A redis-server on a free port. redis-server cannot take port 0, so a port is picked, released and handed
    to it; another process may take it in between, so a server that does not answer is retried on another port."""
    import redis

    for attempt in range(5):
        server = RedisServer(_free_port(), password)
        args = ["--port", str(server.port), "--bind", "127.0.0.1", "--requirepass", server.password]
        args += ["--save", "", "--appendonly", "no", "--dir", str(folder)]
        process = subprocess.Popen([binary, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_for_ping(server, process)
            return server, process
        except (RuntimeError, redis.exceptions.ConnectionError):  # it exited (port taken), or never answered
            process.kill()
            process.wait(timeout=10)
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server per session, started here and stopped at the end (CI installs the package)."""
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed in CI: .ci/run must install it")
        pytest.skip("redis-server is not installed (apt-get install redis-server); the Redis backend is untested")
    server, process = _start_redis(binary, "test-password-Zq9", tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        process.terminate()
        process.wait(timeout=10)


def _wait_for_ping(server: RedisServer, process: subprocess.Popen | None = None) -> None:
    """Until the server answers PING (10 s at most); fails at once if its process has exited."""
    import redis

    deadline = time.monotonic() + 10
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"redis-server on port {server.port} exited with {process.returncode}")
        try:
            with redis.Redis(port=server.port, password=server.password, socket_connect_timeout=1) as client:
                client.ping()
            return
        except redis.exceptions.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture
def tmp_store(tmp_path: Path):
    """A LocalTensorStore in a fresh temporary folder."""
    from resources.store.local import LocalTensorStore

    return LocalTensorStore(tmp_path / "store")


@pytest.fixture
def mem_ledger():
    """An in-memory run ledger at the current schema, with the default price table."""
    from resources.ledger import Ledger

    ledger = Ledger.in_memory()
    yield ledger
    ledger.close()


@pytest.fixture
def tiny_policy():
    """A randomly initialised policy small enough for sub-second rollouts (16x16 images, one block)."""
    from workers.model.tiny_policy import PolicyConfig, build_policy

    config = PolicyConfig(image_size=16, num_layers=1, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
    return build_policy(config, seed=0).eval()


@pytest.fixture
def rollout_store(tmp_store, tiny_policy):
    """A local tensor store holding tiny_policy as version 0 of run "demo" (what rollout workers load)."""
    from workers.rollout.weights import publish_policy

    publish_policy(tmp_store, "demo", tiny_policy)
    return tmp_store


SHARED_RUN_FIXTURES = {"smoke_train", "smoke_nft_train", "smoke_run", "smoke_cluster_run"}
"""Session fixtures that start a whole run (below)."""
SHARED_RUN_FILES = {
    "tests/workers/coordinator/test_golden.py",
    "tests/pipelines/test_outside_checkout.py",
    "tests/pipelines/test_pipeline_cluster.py",
    "tests/pipelines/test_train_nproc.py",
    "tests/pipelines/test_run_nproc.py",
}
"""The files whose tests read them. Under pytest-xdist they all run in one worker, so each run starts once."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The readers of the shared runs go first (the longest group of tests should not start last), and a reader
    outside SHARED_RUN_FILES is an error: under xdist it would start the runs a second time."""
    readers = [item.nodeid for item in items if SHARED_RUN_FIXTURES & set(getattr(item, "fixturenames", ()))]
    strays = [nodeid for nodeid in readers if nodeid.split("::")[0] not in SHARED_RUN_FILES]
    if strays:
        raise pytest.UsageError(f"add these tests' files to SHARED_RUN_FILES in tests/conftest.py: {strays}")
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in SHARED_RUN_FILES)  # stable: order kept within


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test`'s two xdist workers take whole test files (module fixtures, such as a `dagster dev` server,
    start once) and the readers of the shared runs as one group. xdist's own `--dist loadgroup` cannot do this on
    pytest 9.2 (it renames node ids through an attribute pytest no longer reads)."""
    from xdist.scheduler import LoadScopeScheduling

    class FilesAndSharedRuns(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::")[0]
            return "shared-runs" if path in SHARED_RUN_FILES else path

    return FilesAndSharedRuns(config, log)


@pytest.fixture(scope="session")
def _torch_default_threads() -> int:
    """torch's thread count as the session started (OMP_NUM_THREADS, else the cores)."""
    import torch

    return torch.get_num_threads()


@pytest.fixture(autouse=True)
def _restore_torch_threads(_torch_default_threads: int) -> Iterator[None]:
    """A test that sets torch's thread count (one thread a process, under load) sets it for itself only."""
    import torch

    yield
    if torch.get_num_threads() != _torch_default_threads:
        torch.set_num_threads(_torch_default_threads)


# Runs several test files read, each started once per session, outside the checkout (tests/runs.py).


@pytest.fixture(scope="session")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working folder outside the checkout, shared by the session's runs (each writes under its own rel/...)."""
    from tests.paths import REPO_ROOT

    folder = tmp_path_factory.mktemp("outside")
    assert REPO_ROOT not in folder.resolve().parents
    return folder


@pytest.fixture(scope="session")
def smoke_train(outside: Path):
    """`spotlight train --preset cpu_smoke --seed 0 --json --out rel/train` (the golden train)."""
    from tests.runs import SMOKE_TRAIN_ARGS, spotlight

    return spotlight(outside, *SMOKE_TRAIN_ARGS)


@pytest.fixture(scope="session")
def smoke_nft_train(outside: Path):
    """`spotlight train --preset cpu_smoke_nft --seed 0 --json --out rel/train_nft` (the NFT golden)."""
    from tests.runs import SMOKE_NFT_TRAIN_ARGS, spotlight

    return spotlight(outside, *SMOKE_NFT_TRAIN_ARGS)


@pytest.fixture(scope="session")
def smoke_run(outside: Path):
    """`spotlight run --preset cpu_smoke --rollouts inprocess --run-dir rel/run` (the golden run)."""
    from tests.runs import SMOKE_RUN_ARGS, spotlight

    return spotlight(outside, *SMOKE_RUN_ARGS)


@pytest.fixture(scope="session")
def smoke_cluster_run(outside: Path):
    """One iteration of cpu_smoke on the default local cluster of worker processes, under preemptions, from a
    tiny policy saved at rel/tiny: `spotlight run ... --checkpoint rel/tiny --run-dir rel/cluster`."""
    from tests.runs import SMOKE_CLUSTER_ARGS, spotlight
    from workers.model.tiny_policy import PolicyConfig, build_policy, save_policy

    config = PolicyConfig(image_size=16, num_layers=1, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
    save_policy(build_policy(config, seed=0).eval(), outside / "rel" / "tiny")
    return spotlight(outside, *SMOKE_CLUSTER_ARGS, "--checkpoint", "rel/tiny", timeout_s=600)
