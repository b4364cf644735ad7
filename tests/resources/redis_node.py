"""The reserved node's Redis as its run block starts it (resources.queue.redis_tls), for the security tests."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

NODE_PASSWORD = "n0de \"pass\" \\ with 'quotes' $HOME `x`"  # any character: the config holds only its SHA-256


@dataclass(frozen=True)
class NodeRedis:
    """A running node Redis: its port, the run's TLS material, and its folder."""

    port: int
    tls: object  # RunTls
    folder: Path

    def url(self, user: str | None = None) -> str:
        return f"rediss://{user + '@' if user else ''}127.0.0.1:{self.port}/0"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def node_redis(folder: Path, mutual_tls: bool = False) -> Iterator[NodeRedis]:
    """Write the node's files from its secrets (write_node_files), start redis-server on them (it daemonizes, as on
    the node), and stop it at the end."""
    from resources.queue.redis_tls import CERT_ENV, KEY_ENV, make_run_tls, write_node_files
    from resources.urls import PASSWORD_ENV, RUN_CA_ENV

    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server")
    tls, port = make_run_tls(), free_port()
    env = {
        PASSWORD_ENV: NODE_PASSWORD,
        RUN_CA_ENV: tls.b64("ca_pem"),
        CERT_ENV: tls.b64("cert_pem"),
        KEY_ENV: tls.b64("key_pem"),
    }
    conf = write_node_files(folder, port, env, mutual_tls=mutual_tls)
    subprocess.run(["redis-server", str(conf)], check=True, timeout=30)
    deadline = time.monotonic() + 10
    while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
        assert time.monotonic() < deadline, "the run's redis-server did not start"
        time.sleep(0.05)
    try:
        yield NodeRedis(port, tls, folder)
    finally:
        os.kill(int((folder / "redis.pid").read_text()), signal.SIGTERM)


def client_env(node: NodeRedis, password: str, client_pem: tuple[bytes, bytes] | None = None) -> dict[str, str]:
    """The environment a client of the node needs: its password, the run's CA, and a client certificate if any."""
    import base64

    from resources.urls import CLIENT_CERT_ENV, CLIENT_KEY_ENV, PASSWORD_ENV, RUN_CA_ENV

    env = {PASSWORD_ENV: password, RUN_CA_ENV: node.tls.b64("ca_pem")}  # type: ignore[attr-defined]
    if client_pem is not None:
        env[CLIENT_CERT_ENV] = base64.b64encode(client_pem[0]).decode()
        env[CLIENT_KEY_ENV] = base64.b64encode(client_pem[1]).decode()
    return env


def open_node_queue(monkeypatch, url: str, env: dict[str, str]):
    """open_queue(url) in a process whose environment is `env` (and nothing else of the Redis variables)."""
    from resources.queue import open_queue
    from resources.queue.base import QueueConfig
    from resources.urls import CLIENT_CERT_ENV, CLIENT_KEY_ENV, PASSWORD_ENV, PASSWORD_FILE_ENV, RUN_CA_ENV

    for name in (PASSWORD_ENV, PASSWORD_FILE_ENV, RUN_CA_ENV, CLIENT_CERT_ENV, CLIENT_KEY_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return open_queue(url, QueueConfig(connect_timeout_s=3.0, reconnect_s=1.0))
