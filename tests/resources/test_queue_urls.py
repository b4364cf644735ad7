"""Queue URLs, credentials and reachability: what a user sees when a queue cannot be opened.

The queue contract itself: tests/resources/test_queue.py.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from resources.queue import open_queue
from resources.queue.base import PASSWORD_ENV, QueueConfig, QueueUnavailableError, parse_queue_url


def rollout(rid: str) -> dict:
    return {"request_id": rid, "iteration": 0, "kind": "rollout", "payload": {}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- URLs, credentials, reachability -------------------------------------------------------


def test_unknown_url_schemes_are_rejected_naming_the_supported_ones() -> None:
    with pytest.raises(ValueError, match="unsupported queue URL scheme 'amqp'.*sqlite:///.*redis://"):
        parse_queue_url("amqp://host/queue")


def test_a_sqlite_url_and_a_plain_path_open_the_same_file(tmp_path: Path) -> None:
    with open_queue(tmp_path / "q.db") as first:
        first.put([rollout("r0")])
    with open_queue(f"sqlite://{tmp_path}/q.db") as second:
        assert second.claim("w", lease_s=5).request_id == "r0"
        assert second.url == f"sqlite://{tmp_path.resolve()}/q.db"
    with pytest.raises(ValueError, match="sqlite:///absolute/path.db"):
        parse_queue_url("sqlite://relative/q.db")


def test_redis_urls_take_the_password_from_the_url_or_the_environment_and_never_show_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    address = parse_queue_url("redis://:s%40cret@example.org:6380/2")
    assert (address.host, address.port, address.db, address.password) == ("example.org", 6380, 2, "s@cret")
    assert "cret" not in repr(address) and address.url == "redis://example.org:6380/2"
    assert parse_queue_url("redis://example.org").password == "from-env"
    with pytest.raises(ValueError, match="database must be a number") as err:
        parse_queue_url("redis://:hunter2@example.org:6379/zero")
    assert "hunter2" not in str(err.value)


def test_a_wrong_redis_password_fails_with_a_clear_error_that_hides_it(redis_server) -> None:
    with pytest.raises(QueueUnavailableError, match="rejected the credentials.*SPOTLIGHT_REDIS_PASSWORD") as err:
        open_queue(redis_server.url(password="wrong-pass-7"))
    assert "wrong-pass-7" not in str(err.value)


def test_a_missing_redis_password_fails_with_a_clear_error(redis_server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(QueueUnavailableError, match="rejected the credentials"):
        open_queue(redis_server.url())


def test_an_unreachable_redis_fails_quickly_with_a_clear_error() -> None:
    started = time.monotonic()
    with pytest.raises(QueueUnavailableError, match=r"cannot reach the Redis queue at 127\.0\.0\.1:\d+/0"):
        open_queue(f"redis://127.0.0.1:{_free_port()}/0", QueueConfig(connect_timeout_s=1.0))
    assert time.monotonic() - started < 5


def test_dagster_queue_resource_checks_the_url_at_load_and_opens_a_working_queue(tmp_path: Path) -> None:
    from resources.dagster_resources import QueueResource

    with pytest.raises(Exception, match="unsupported queue URL scheme 'amqp'"):
        QueueResource(url="amqp://host/q")
    with pytest.raises(Exception) as err:
        QueueResource(url="redis://:hunter2@host:1/zero")
    assert "hunter2" not in str(err.value)
    with QueueResource(url=str(tmp_path / "q.db"), max_deliveries=2).get_queue() as opened:
        assert opened.config.max_deliveries == 2
        assert opened.put([rollout("r0")]) == 1


def test_the_runs_ca_must_be_a_base64_certificate(monkeypatch) -> None:
    import base64

    from resources.queue.redis_tls import make_run_tls
    from resources.urls import RUN_CA_ENV

    monkeypatch.setenv(RUN_CA_ENV, "not base64!")
    with pytest.raises(ValueError, match=f"{RUN_CA_ENV} is not a base64 PEM certificate"):
        parse_queue_url("rediss://example.org:6379/0")
    monkeypatch.setenv(RUN_CA_ENV, base64.b64encode(b"hello").decode())
    with pytest.raises(ValueError, match=RUN_CA_ENV):
        parse_queue_url("rediss://example.org:6379/0")
    ca = make_run_tls().ca_pem
    monkeypatch.setenv(RUN_CA_ENV, base64.b64encode(ca).decode())
    address = parse_queue_url("rediss://spotlight-worker@example.org:6379/0")
    assert address.run_ca == ca.decode() and address.username == "spotlight-worker" and "BEGIN" not in repr(address)
    assert parse_queue_url("redis://example.org:6379/0").run_ca is None  # only TLS reads it


@pytest.mark.parametrize(
    "url,public,password",
    [
        ("redis://:s%40cret@reserved:6379/0", "redis://reserved:6379/0", "s@cret"),
        ("rediss://user:pw@reserved:6380/2", "rediss://user@reserved:6380/2", "pw"),
        ("redis://reserved:6379/0", "redis://reserved:6379/0", None),
        ("runs/demo/queue.db", "runs/demo/queue.db", None),
    ],
)
def test_a_child_process_gets_the_queue_url_without_its_password(url: str, public: str, password: str | None) -> None:
    from resources.urls import split_password

    assert split_password(url) == (public, password)
