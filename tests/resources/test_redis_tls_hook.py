"""redis-py's private TLS hook that RunCaConnection overrides: the test fails if a release drops or bypasses it."""

from __future__ import annotations


def test_redis_py_still_has_the_tls_hook_the_run_ca_connection_overrides() -> None:
    import redis

    from resources.queue.redis_streams import RunCaConnection

    assert callable(getattr(redis.connection.SSLConnection, "_wrap_socket_with_ssl", None)), (
        f"redis-py {redis.__version__} has no SSLConnection._wrap_socket_with_ssl: RunCaConnection (the run's CA "
        "alone, the server's name instead of its host) needs another way to build its SSLContext"
    )
    assert "_wrap_socket_with_ssl" in vars(RunCaConnection)


def test_connecting_goes_through_the_hook(tmp_path, monkeypatch) -> None:
    """The node's certificate names spotlight-redis, not 127.0.0.1: only the override's context accepts it, so a
    redis-py that stopped calling the hook fails here."""
    from resources.queue.redis_streams import RunCaConnection
    from tests.resources.redis_node import NODE_PASSWORD, client_env, node_redis, open_node_queue

    calls = []
    real = RunCaConnection._wrap_socket_with_ssl
    monkeypatch.setattr(
        RunCaConnection, "_wrap_socket_with_ssl", lambda self, sock: calls.append(1) or real(self, sock)
    )
    with node_redis(tmp_path / "redis") as node:
        with open_node_queue(monkeypatch, node.url(), client_env(node, NODE_PASSWORD)) as queue:
            assert queue.stats().pending == 0
    assert calls, "redis-py connected without calling _wrap_socket_with_ssl"


def test_the_pin_asks_for_the_redis_py_that_has_the_hook() -> None:
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    (redis_pin,) = [Requirement(r) for r in pyproject["project"]["dependencies"] if Requirement(r).name == "redis"]
    assert redis_pin.specifier.contains("5.1.0") and not redis_pin.specifier.contains("5.0.9")
