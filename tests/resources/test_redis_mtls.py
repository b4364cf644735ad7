"""A public queue runs with mutual TLS: a client without a certificate of the run's CA is cut off before a password."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.resources.redis_node import NODE_PASSWORD, NodeRedis, client_env, node_redis, open_node_queue


@pytest.fixture(scope="module")
def public_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeRedis]:
    with node_redis(tmp_path_factory.mktemp("mtls-redis"), mutual_tls=True) as running:
        yield running


def test_the_two_modes_differ_only_in_asking_clients_for_a_certificate(tmp_path) -> None:
    from resources.queue.redis_tls import redis_conf

    private, public = redis_conf(tmp_path, 6379).splitlines(), redis_conf(tmp_path, 6379, mutual_tls=True).splitlines()
    assert "tls-auth-clients no" in private and "tls-auth-clients yes" in public
    assert [line for line in private if line not in public] == ["tls-auth-clients no"]
    assert private[0] == "port 0" and f"aclfile {tmp_path}/users.acl" in private  # TLS only, users from the file


def test_a_client_without_a_certificate_is_refused_in_mutual_tls_mode(public_node, monkeypatch) -> None:
    from resources.queue.base import QueueUnavailableError

    with pytest.raises(QueueUnavailableError, match="cannot reach") as err:
        open_node_queue(monkeypatch, public_node.url(), client_env(public_node, NODE_PASSWORD))  # the right password
    assert NODE_PASSWORD not in str(err.value)


def test_a_certificate_of_another_runs_ca_is_refused(public_node, monkeypatch) -> None:
    from resources.queue.base import QueueUnavailableError
    from resources.queue.redis_certs import client_cert, make_run_tls

    stranger = client_cert(make_run_tls(), "spotlight-w1-a1b2c3d4e5f6")
    with pytest.raises(QueueUnavailableError, match="cannot reach"):
        open_node_queue(monkeypatch, public_node.url(), client_env(public_node, NODE_PASSWORD, stranger))


def test_a_worker_with_its_certificate_and_its_password_works_the_queue(public_node, monkeypatch) -> None:
    from resources.queue.base import QueueUnavailableError
    from resources.queue.redis_acl import grant_worker, new_nonce, worker_password, worker_user
    from resources.queue.redis_certs import client_cert

    server_pem = (public_node.tls.cert_pem, public_node.tls.key_pem)  # the coordinator on the node presents it
    with open_node_queue(monkeypatch, public_node.url(), client_env(public_node, NODE_PASSWORD, server_pem)) as admin:
        user = worker_user(1, new_nonce())
        grant_worker(admin._redis, user, worker_password(NODE_PASSWORD, user))
        admin.put([{"request_id": "r0", "iteration": 0, "kind": "rollout", "payload": {}}])
    mine = client_cert(public_node.tls, user)
    env = client_env(public_node, worker_password(NODE_PASSWORD, user), mine)
    with open_node_queue(monkeypatch, public_node.url(user), env) as worker:
        assert worker.claim("w1", lease_s=5).request_id == "r0"
    with pytest.raises(QueueUnavailableError, match="rejected the credentials"):  # a certificate is not a password
        open_node_queue(monkeypatch, public_node.url(user), client_env(public_node, "guess", mine))


def test_no_client_certificate_without_the_runs_ca_key() -> None:
    from dataclasses import replace

    from resources.queue.redis_certs import client_cert, make_run_tls

    with pytest.raises(ValueError, match=r"CA key \(ca.key\) is not on this machine"):
        client_cert(replace(make_run_tls(), ca_key_pem=None), "spotlight-w1-a1b2c3d4e5f6")


def test_the_ca_key_stays_on_the_launching_machine_and_never_reaches_a_node(tmp_path) -> None:
    from resources.cloud.tasks import with_run_tls
    from resources.queue.redis_certs import run_tls

    tls = run_tls(tmp_path / "tls")
    assert (tmp_path / "tls" / "ca.key").stat().st_mode & 0o077 == 0 and tls.ca_key_pem is not None
    assert run_tls(tmp_path / "tls") == tls  # a relaunch reads the same files, the CA key included
    shipped = with_run_tls({}, tls)
    assert not any(tls.b64("ca_key_pem") in value for value in shipped.values())


def test_the_launcher_reaches_a_public_queue_with_the_client_certificate_it_signed(public_node) -> None:
    """`spotlight launch --public-queue` waits for the node's Redis with the certificate it gives the workers: without
    it the mutual-TLS node cuts every PING and the launch waits for nothing."""
    from resources.cloud import wait_for_redis, with_run_tls
    from resources.urls import PASSWORD_ENV

    secrets = with_run_tls({PASSWORD_ENV: NODE_PASSWORD}, public_node.tls)
    wait_for_redis(public_node.url(), secrets, timeout_s=5.0, echo=lambda _: None, poll_s=0.5)
