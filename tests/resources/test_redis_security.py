"""Redis credentials and TLS: the password comes from a variable or a file, never shows, and rediss:// works."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest

from resources.queue import open_queue
from resources.queue.base import QueueConfig, QueueUnavailableError, parse_queue_url
from resources.urls import CA_FILE_ENV, PASSWORD_ENV, PASSWORD_FILE_ENV

PASSWORD = "tls-pass-Kq7"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """A redis-server that speaks only TLS (self-signed for 127.0.0.1), password in its config file: (port, CA file)."""
    if shutil.which("redis-server") is None or shutil.which("openssl") is None:
        pytest.skip("needs redis-server and openssl")
    folder = tmp_path_factory.mktemp("tls-redis")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(folder / "key.pem"),
            "-out",
            str(folder / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    port = _free_port()
    (folder / "redis.conf").write_text(
        f"port 0\ntls-port {port}\nbind 127.0.0.1\ntls-cert-file {folder}/cert.pem\ntls-key-file {folder}/key.pem\n"
        f'tls-ca-cert-file {folder}/cert.pem\ntls-auth-clients no\nrequirepass {PASSWORD}\nsave ""\ndir {folder}\n'
    )
    process = subprocess.Popen(
        ["redis-server", str(folder / "redis.conf")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 10
        while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
            assert time.monotonic() < deadline and process.poll() is None, "the TLS redis-server did not start"
            time.sleep(0.05)
        yield port, folder / "cert.pem"
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_the_password_comes_from_a_file_named_by_an_environment_variable(tmp_path, monkeypatch) -> None:
    secret = tmp_path / "redis-password"
    secret.write_text("from-file-3x\n")
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(secret))
    address = parse_queue_url("redis://example.org:6379/0")
    assert address.password == "from-file-3x"
    assert "from-file" not in repr(address) and "from-file" not in address.url
    monkeypatch.setenv(PASSWORD_ENV, "from-env-9")  # the variable wins over the file
    assert parse_queue_url("redis://example.org/0").password == "from-env-9"


@pytest.mark.parametrize("content, message", [(None, "cannot be read"), ("\n", "is empty")])
def test_an_unusable_password_file_is_refused_naming_the_variable(tmp_path, monkeypatch, content, message) -> None:
    secret = tmp_path / "pw"
    if content is not None:
        secret.write_text(content)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    monkeypatch.setenv(PASSWORD_FILE_ENV, str(secret))
    with pytest.raises(ValueError, match=f"{PASSWORD_FILE_ENV}=.*{message}"):
        parse_queue_url("redis://example.org/0")


def test_rediss_talks_tls_to_a_tls_only_server_and_checks_its_certificate(tls_redis, monkeypatch) -> None:
    port, ca_file = tls_redis
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    monkeypatch.setenv(CA_FILE_ENV, str(ca_file))
    with open_queue(f"rediss://127.0.0.1:{port}/0") as queue:
        queue.put([{"request_id": "r0", "iteration": 0, "kind": "rollout", "payload": {}}])
        assert queue.claim("w", lease_s=5).request_id == "r0"
        assert queue.url == f"rediss://127.0.0.1:{port}/0"
    monkeypatch.delenv(CA_FILE_ENV)  # a self-signed server is not trusted by the system's CAs
    with pytest.raises(QueueUnavailableError, match="cannot reach"):
        open_queue(f"rediss://127.0.0.1:{port}/0", QueueConfig(connect_timeout_s=2.0))


def test_plain_redis_against_a_tls_server_fails_with_a_clear_error(tls_redis, monkeypatch) -> None:
    port, _ = tls_redis
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)
    with pytest.raises(QueueUnavailableError, match=f"127.0.0.1:{port}") as err:
        open_queue(f"redis://127.0.0.1:{port}/0", QueueConfig(connect_timeout_s=2.0))
    assert PASSWORD not in str(err.value)


def test_a_missing_ca_file_is_refused_before_connecting(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv(CA_FILE_ENV, str(tmp_path / "nope.pem"))
    with pytest.raises(ValueError, match=f"{CA_FILE_ENV}=.*is not a file"):
        parse_queue_url("rediss://example.org:6380/0")


@pytest.fixture(scope="module")
def run_redis(tmp_path_factory: pytest.TempPathFactory):
    """The reserved node's Redis as its run block starts it (resources.queue.redis_tls)."""
    from tests.resources.redis_node import node_redis

    with node_redis(tmp_path_factory.mktemp("run-redis")) as node:
        yield node


def test_the_nodes_config_and_key_are_private_and_hold_no_plain_password(run_redis) -> None:
    from tests.resources.redis_node import NODE_PASSWORD

    folder = run_redis.folder
    for name in ("redis.conf", "server.key", "users.acl"):
        assert (folder / name).stat().st_mode & 0o077 == 0, f"{name} is readable by others"
    conf = (folder / "redis.conf").read_text() + (folder / "users.acl").read_text()
    assert NODE_PASSWORD not in conf and "requirepass" not in conf and conf.startswith("port 0\n")  # no clear text
    assert not (folder / "ca.key").exists()  # the CA's key never reaches the node


@pytest.mark.parametrize(
    "case, message",
    [
        ("the coordinator's password", "rejected the credentials"),
        ("a wrong password", "rejected the credentials"),
        ("no CA", "not signed by a CA this process trusts"),
        ("another run's CA", "not signed by a CA this process trusts"),
        ("clear text", r"a TLS server\? use rediss://"),
    ],
)
def test_a_worker_without_the_runs_ca_and_its_own_password_is_refused_saying_why(
    run_redis, monkeypatch, case, message
) -> None:
    from resources.queue.redis_acl import grant_worker, worker_password, worker_user
    from resources.queue.redis_tls import make_run_tls
    from resources.urls import RUN_CA_ENV
    from tests.resources.redis_node import NODE_PASSWORD, client_env, open_node_queue

    user = worker_user(1, "a1b2c3d4e5f6")
    with open_node_queue(monkeypatch, run_redis.url(), client_env(run_redis, NODE_PASSWORD)) as coordinator:
        grant_worker(coordinator._redis, user, worker_password(NODE_PASSWORD, user))
    env = client_env(run_redis, worker_password(NODE_PASSWORD, user))
    env[PASSWORD_ENV] = {"the coordinator's password": NODE_PASSWORD, "a wrong password": "guess"}.get(
        case, env[PASSWORD_ENV]
    )
    env[RUN_CA_ENV] = {"no CA": "", "another run's CA": make_run_tls().b64("ca_pem")}.get(case, env[RUN_CA_ENV])
    url = run_redis.url(user).replace("rediss://", "redis://") if case == "clear text" else run_redis.url(user)
    with pytest.raises(QueueUnavailableError, match=message) as err:
        open_node_queue(monkeypatch, url, env)
    assert NODE_PASSWORD not in str(err.value)
