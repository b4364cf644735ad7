"""A worker's own ACL user on the node's Redis: the worker's queue calls work, every other command is refused, and a
revoked user's connections and password stop working."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.resources.redis_node import NODE_PASSWORD, NodeRedis, client_env, node_redis, open_node_queue

P = "spotlight:{queue}"
ALL_KEYS = [f"{P}:{name}" for name in ("stream:rollout", "state", "open", "results", "dead", "counts", "acks")]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeRedis]:
    with node_redis(tmp_path_factory.mktemp("acl-redis")) as running:
        yield running


@pytest.fixture
def admin(node: NodeRedis, monkeypatch):
    """The coordinator's queue (the default user): it loads the functions and holds two requests and the run's
    info."""
    with open_node_queue(monkeypatch, node.url(), client_env(node, NODE_PASSWORD)) as first:
        first._redis.flushall()  # a fresh queue for each test (the functions stay)
    queue = open_node_queue(monkeypatch, node.url(), client_env(node, NODE_PASSWORD))
    queue.put([{"request_id": f"r{i}", "iteration": 0, "kind": "rollout", "payload": {}} for i in range(2)])
    queue.publish_info({"usd_total": 1.0, "run_ended": False})
    yield queue
    queue.close()


def _worker(node: NodeRedis, admin, monkeypatch, slot: int = 1):
    from resources.queue.redis_acl import grant_worker, new_nonce, worker_password, worker_user

    user = worker_user(slot, new_nonce())
    grant_worker(admin._redis, user, worker_password(NODE_PASSWORD, user))
    queue = open_node_queue(monkeypatch, node.url(user), client_env(node, worker_password(NODE_PASSWORD, user)))
    return user, queue


def test_a_worker_user_works_the_queue_as_a_rollout_worker_does(node, admin, monkeypatch) -> None:
    from resources.run_status import _read_info

    user, worker = _worker(node, admin, monkeypatch)
    with worker:
        lease = worker.claim("w1", lease_s=5)
        assert lease is not None and worker.heartbeat(lease) and worker.ack(lease, "runs/demo/result")
        assert worker.release(worker.claim("w1", lease_s=5))
        worker.append_events([{"worker_id": "w1", "event": "ready"}])
        assert worker.info()["usd_total"] == 1.0 and worker.stats().done == 1
        assert _read_info(node.url(user))["run_ended"] is False  # the spend gate's read
    assert admin.results(["r0"]) == {"r0": "runs/demo/result"}
    assert admin.read_events()[1] == [{"worker_id": "w1", "event": "ready"}]


FORBIDDEN = [
    # code of its own, or the server's code changed
    ["EVAL", "while true do end", "0"],
    ["EVAL_RO", "return 1", "0"],
    ["EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "0"],
    ["SCRIPT", "LOAD", "return 1"],
    ["SCRIPT", "KILL"],
    ["SCRIPT", "FLUSH"],
    ["FUNCTION", "FLUSH"],
    ["FUNCTION", "DELETE", "spotlight_queue"],
    ["FUNCTION", "LOAD", "REPLACE", "#!lua name=spotlight_queue\nredis.register_function('x', function() end)"],
    ["FUNCTION", "KILL"],
    ["FUNCTION", "DUMP"],
    ["FUNCTION", "LIST"],
    # the coordinator's queue functions: enqueue, cancel, purge
    ["FCALL", "spotlight_put", "13", *[f"{P}:k{i}" for i in range(13)], "x", "rollout", "0", "{}"],
    ["FCALL", "spotlight_cancel", "0", "0", ""],
    ["FCALL", "spotlight_purge", "0", "9", "100"],
    # deleting or emptying the queue
    *[["DEL", key] for key in ALL_KEYS],
    *[["UNLINK", key] for key in ALL_KEYS],
    ["XTRIM", f"{P}:stream:rollout", "MAXLEN", "0"],
    ["XGROUP", "DESTROY", f"{P}:stream:rollout", "workers"],
    ["XSETID", f"{P}:stream:rollout", "0-1"],
    ["EXPIRE", f"{P}:state", "1"],
    ["RENAME", f"{P}:state", f"{P}:gone"],
    ["HINCRBY", f"{P}:counts", "cancelled", "1"],
    ["XADD", f"{P}:stream:rollout", "*", "id", "forged", "body", "{}"],
    ["XREAD", "STREAMS", f"{P}:worker_events", "0"],
    # the run's state
    ["HSET", f"{P}:run_info", "run_ended", "true"],
    ["HSET", f"{P}:run_info", "usd_total", "0"],
    ["HDEL", f"{P}:run_info", "usd_total"],
    ["DEL", f"{P}:run_info"],
    # the server
    ["CONFIG", "SET", "requirepass", "x"],
    ["CONFIG", "GET", "*"],
    ["ACL", "LIST"],
    ["ACL", "SETUSER", "me", "on", "+@all"],
    ["ACL", "DELUSER", "default"],
    ["KEYS", "*"],
    ["SCAN", "0"],
    ["FLUSHALL"],
    ["FLUSHDB"],
    ["MODULE", "LIST"],
    ["MODULE", "LOAD", "/tmp/x.so"],
    ["DEBUG", "SLEEP", "0"],
    ["MONITOR"],
    ["CLIENT", "LIST"],
    ["CLIENT", "KILL", "USER", "default"],
    ["SAVE"],
    ["BGREWRITEAOF"],
    ["REPLICAOF", "127.0.0.1", "1"],
    ["SWAPDB", "0", "1"],
    ["SELECT", "1"],
    ["MULTI"],
    ["PUBLISH", "c", "m"],
    ["SUBSCRIBE", "c"],
    ["SET", "elsewhere", "1"],
    ["GET", "elsewhere"],
    ["SHUTDOWN", "NOSAVE"],
]


def test_a_worker_user_is_refused_every_other_command(node, admin, monkeypatch) -> None:
    import redis

    _, worker = _worker(node, admin, monkeypatch)
    allowed = []
    with worker:
        for command in FORBIDDEN:
            try:
                worker._redis.execute_command(*command)
                allowed.append(command)
            except redis.exceptions.NoPermissionError:
                pass
            except redis.exceptions.ResponseError as err:  # MODULE LOAD, DEBUG: refused to every client first
                if "command not allowed" not in str(err):
                    allowed.append(command)
    assert allowed == []
    assert admin._redis.fcall_ro("spotlight_version", 0)  # the functions are still there
    assert admin.stats().pending == 2 and admin.info()["usd_total"] == 1.0  # nothing was emptied or rewritten


def test_a_revoked_worker_loses_its_connection_and_its_password(node, admin, monkeypatch) -> None:
    from resources.queue.base import QueueUnavailableError
    from resources.queue.redis_acl import revoke_worker, worker_password, worker_users

    user, worker = _worker(node, admin, monkeypatch)
    other, colleague = _worker(node, admin, monkeypatch, slot=2)
    assert worker.claim("w1", lease_s=5) is not None and set(worker_users(admin._redis)) >= {user, other}
    assert revoke_worker(admin._redis, user)
    with pytest.raises(QueueUnavailableError, match="rejected the credentials"):
        worker.stats()  # its open connection was killed, and logging in again fails
    with pytest.raises(QueueUnavailableError, match="rejected the credentials"):
        open_node_queue(monkeypatch, node.url(user), client_env(node, worker_password(NODE_PASSWORD, user)))
    assert colleague.claim("w2", lease_s=5) is not None  # another worker's user is untouched
    assert user not in (node.folder / "users.acl").read_text() and other in (node.folder / "users.acl").read_text()
    worker.close()
    colleague.close()


def test_a_worker_password_opens_only_its_own_user(node, admin, monkeypatch) -> None:
    from resources.queue.base import QueueUnavailableError
    from resources.queue.redis_acl import grant_worker, worker_password, worker_user

    mine, theirs = worker_user(3, "a1b2c3d4e5f6"), worker_user(4, "0f1e2d3c4b5a")
    for user in (mine, theirs):
        grant_worker(admin._redis, user, worker_password(NODE_PASSWORD, user))
    with pytest.raises(QueueUnavailableError, match="rejected the credentials"):
        open_node_queue(monkeypatch, node.url(theirs), client_env(node, worker_password(NODE_PASSWORD, mine)))
    with pytest.raises(QueueUnavailableError, match="rejected the credentials"):
        open_node_queue(monkeypatch, node.url(mine), client_env(node, NODE_PASSWORD))


def test_the_acl_file_keeps_granted_workers_across_a_rewrite_of_the_nodes_files() -> None:
    from resources.queue.redis_tls import acl_file

    previous = "user default on #00 ~* &* +@all\nuser spotlight-w1-a1b2c3d4e5f6 on #11 resetchannels -@all\n"
    text = acl_file("new-admin-password", previous)
    assert "user spotlight-w1-a1b2c3d4e5f6 on #11" in text and "#00" not in text
    assert text.startswith("user default on #") and "new-admin-password" not in text


@pytest.mark.parametrize("slot, nonce", [(-1, "a1b2c3d4"), (1, "short"), (1, "not-hex-at-all!"), (True, "a1b2c3d4")])
def test_a_bad_worker_user_name_is_refused(slot, nonce) -> None:
    from resources.queue.redis_acl import worker_user

    with pytest.raises(ValueError, match="slot >= 0 and a nonce"):
        worker_user(slot, nonce)


def test_the_coordinator_is_never_revoked_as_a_worker(node, admin) -> None:
    from resources.queue.redis_acl import revoke_worker

    with pytest.raises(ValueError, match="never revoked"):
        revoke_worker(admin._redis, "default")


def test_at_the_runs_end_every_worker_user_goes_once_its_workers_have_left(node, admin, monkeypatch) -> None:
    import time

    from resources.queue.base import QueueUnavailableError
    from resources.queue.redis_acl import revoke_all_workers, worker_users

    _, idle = _worker(node, admin, monkeypatch, slot=1)
    idle.close()  # it has stopped: no connection left
    _, lingering = _worker(node, admin, monkeypatch, slot=2)
    started = time.monotonic()
    assert revoke_all_workers(admin._redis, grace_s=1.0, poll_s=0.2) >= 2
    assert 0.8 <= time.monotonic() - started < 5  # it waited for the lingering worker, then no longer
    assert worker_users(admin._redis) == []
    with pytest.raises(QueueUnavailableError, match="rejected the credentials"):
        lingering.stats()
    started = time.monotonic()
    assert revoke_all_workers(admin._redis, grace_s=30.0) == 0 and time.monotonic() - started < 1


def test_a_worker_before_the_coordinator_has_loaded_the_functions_is_told_so(node, admin, monkeypatch) -> None:
    from resources.queue.base import QueueError
    from resources.queue.redis_acl import grant_worker, worker_password, worker_user

    user = worker_user(5, "a1b2c3d4e5f6")
    grant_worker(admin._redis, user, worker_password(NODE_PASSWORD, user))
    admin._redis.function_delete("spotlight_queue")
    try:
        with pytest.raises(QueueError, match="has no queue functions and this code needs version"):
            open_node_queue(monkeypatch, node.url(user), client_env(node, worker_password(NODE_PASSWORD, user)))
    finally:
        open_node_queue(monkeypatch, node.url(), client_env(node, NODE_PASSWORD)).close()  # loads them again


def test_a_redis_without_an_acl_file_still_grants_and_revokes(redis_server) -> None:
    """A Redis started without the node's aclfile (a user's own): ACL SAVE is refused there, the grant still holds."""
    import redis

    from resources.queue.redis_acl import grant_worker, revoke_worker, worker_user, worker_users

    user = worker_user(7, "a1b2c3d4e5f6")
    with redis.Redis(port=redis_server.port, password=redis_server.password) as admin:
        grant_worker(admin, user, "pw-of-the-worker")
        assert user in worker_users(admin)
        assert revoke_worker(admin, user) and user not in worker_users(admin)
