"""The reserved node's Redis as its run block starts it, for the launch tests (tests/pipelines/sky_fakes.py's
`reserved_redis` fixture): TLS with the run's CA from the launcher's state folder, the ACL file, the password."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class NodeRedis:
    """The reserved node's Redis as its run block starts it: TLS with the run's CA, the ACL users, the password."""

    port: int
    password: str
    folder: Any

    def url(self, user: str = "") -> str:
        return f"rediss://{user + '@' if user else ''}127.0.0.1:{self.port}/0"


def start_node_redis(cluster: str, folder, password: str, mutual_tls: bool = False) -> NodeRedis:
    """A redis-server configured by resources.queue.redis_tls, as `cluster`'s node's run block starts it, from the
    TLS files `spotlight launch` reads for that cluster (made here first, in the state folder); `mutual_tls` as a
    public queue's node (REDIS_MUTUAL_TLS=yes)."""
    import socket
    import subprocess

    from resources.cloud import tls_folder, with_run_tls
    from resources.queue.redis_tls import run_tls, write_node_files
    from tests.pipelines.sky_blocks import wait_for

    tls = run_tls(tls_folder(cluster))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    conf = write_node_files(folder, port, with_run_tls({"SPOTLIGHT_REDIS_PASSWORD": password}, tls), mutual_tls)
    subprocess.run(["redis-server", str(conf)], check=True, timeout=30)  # daemonizes, as on the node
    wait_for(
        lambda: (folder / "redis.pid").exists() and socket.socket().connect_ex(("127.0.0.1", port)) == 0,
        20,
        "the node's redis-server",
    )
    return NodeRedis(port, password, folder)


def stop_node_redis(node: NodeRedis) -> None:
    import os
    import signal

    os.kill(int((node.folder / "redis.pid").read_text()), signal.SIGTERM)
