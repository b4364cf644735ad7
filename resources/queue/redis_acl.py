"""A Redis ACL user per spot worker: its own password, the commands and keys a worker needs, revoked when done.

Each worker job gets a user `spotlight-w<slot>-<nonce>` (a fresh nonce per job launched) whose password is an
HMAC of the coordinator's password and that name: the launcher and the node derive it alone, nothing secret goes
with a grant or a revocation, and one worker's password opens no other user. The coordinator's connection (Redis's
`default` user, on the node) grants it (`grant_worker`: ACL SETUSER, then ACL SAVE into the node's 0600 users.acl,
so a restarted Redis keeps it) and revokes it (`revoke_worker`: the user switched off, CLIENT KILL USER on the
connections it has open, then ACL DELUSER). What a worker may do (`worker_rules`), enumerated from its queue calls
(claim, heartbeat, release, ack, stats; the run's info; its events):
- FCALL of the worker's functions of the queue's library (resources/queue/redis_lua.py) and no other code:
  no EVAL, SCRIPT, FUNCTION (load, delete, flush, kill);
- inside them, only the commands those functions run, each on its own keys (ACL selectors; Redis checks a
  function's commands against the caller's ACL): no XADD to the request streams (no made-up requests), no
  DEL/UNLINK/XTRIM/XGROUP, no writes to the run's state (`run_info`: read only; the `counts` hash: read only);
- HGETALL of run_info (the spend gate), XADD to its events stream; PING, HELLO, TIME;
- nothing else: no CONFIG, ACL, KEYS, SCAN, FLUSH*, MODULE, DEBUG, SHUTDOWN, MONITOR, CLIENT, no channels.

Example:
    user = worker_user(3, new_nonce())                  # the launcher, for worker job 3
    secret = worker_password(coordinator_password, user)   # that job's SPOTLIGHT_REDIS_PASSWORD
    grant_worker(admin_client, user, secret)            # the coordinator's connection (or the launcher's)
    revoke_worker(admin_client, user)                   # the job ended
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import re
import secrets
import sys
from typing import Any, Mapping

from resources.queue import redis_lua as lua

WORKER_PREFIX = "spotlight-w"
"""Every worker user's name starts so (`revoke_all_workers` finds them by it)."""
_NAME = re.compile(rf"^{WORKER_PREFIX}(\d+)-([0-9a-f]{{8,32}})$")
WORKER_FUNCTIONS = ("claim", "extend", "ack", "adopt")
"""The queue functions a worker calls with FCALL (extend = heartbeat and release; adopt runs when a queue opens)."""
WORKER_READ_FUNCTIONS = ("stats", "version")
"""The read-only ones it calls with FCALL_RO."""


def new_nonce() -> str:
    """A fresh random part for a worker user's name: each job launch gets a credential of its own."""
    return secrets.token_hex(6)


def worker_user(slot: int, nonce: str) -> str:
    """The ACL user of worker job `slot` launched with `nonce`; ValueError for a name Redis or revocation would
    mistake."""
    name = f"{WORKER_PREFIX}{slot}-{nonce}"
    if isinstance(slot, bool) or not isinstance(slot, int) or slot < 0 or not _NAME.match(name):
        raise ValueError(f"a worker user needs a slot >= 0 and a nonce of 8-32 hex digits, got {slot!r}, {nonce!r}")
    return name


def worker_password(coordinator_password: str, user: str) -> str:
    """The password of worker user `user`, derived from the coordinator's: it opens that user and nothing else."""
    return hmac.new(coordinator_password.encode(), f"spotlight-worker/{user}".encode(), hashlib.sha256).hexdigest()


def worker_rules() -> list[str]:
    """The ACL rules of a worker user, after `reset` (see the module docstring for what they allow)."""
    p = lua.PREFIX
    calls = [f"+fcall|{lua.function_name(op)}" for op in WORKER_FUNCTIONS]
    calls += [f"+fcall_ro|{lua.function_name(op)}" for op in WORKER_READ_FUNCTIONS]
    selectors = [
        # FCALL names all thirteen keys (Redis assumes read-write for them); what the function then does with
        # each key is checked against the selectors below, one key family each.
        " ".join([*(f"~{key}" for key in lua.queue_keys()), *calls]),
        f"~{p}:stream:* +xreadgroup +xclaim +xpending +xack +xdel +xrange",
        f"~{p}:state ~{p}:acks +hget +hset",
        f"~{p}:open +hget +hdel +hlen",
        f"~{p}:results +hset +hmget +hlen",
        f"~{p}:dead +xadd +xrange +xdel +xlen",
        f"%R~{p}:counts +hget",
        f"~{p}:leases:* +zrangebyscore +zadd +zrem +zscore +zcount",
        f"~{p}:done +zadd",
        f"%W~{p}:worker_events +xadd",
        f"%R~{p}:run_info +hgetall",
    ]
    return ["resetchannels", "resetkeys", "-@all", "+ping", "+hello", "+time", *(f"({s})" for s in selectors)]


def grant_worker(admin: Any, user: str, password: str) -> None:
    """Create (or reset) worker user `user` with `password` (stored as its SHA-256) and the worker's rules, through
    an admin connection (redis-py); ACL SAVE when the server keeps an ACL file."""
    if not _NAME.match(user):
        raise ValueError(f"{user!r} is not a worker user's name ({WORKER_PREFIX}<slot>-<hex nonce>)")
    digest = hashlib.sha256(password.encode()).hexdigest()
    admin.execute_command("ACL", "SETUSER", user, "reset", "on", f"#{digest}", *worker_rules())
    _save(admin)


def revoke_worker(admin: Any, user: str) -> bool:
    """Delete worker user `user` and close its open connections: its password and connections stop working at
    once. True when it existed."""
    if not _NAME.match(user):
        raise ValueError(f"{user!r} is not a worker user's name: the coordinator and other users are never revoked")
    if user not in worker_users(admin):
        return False
    admin.execute_command("ACL", "SETUSER", user, "off")  # no new login from here on
    admin.execute_command("CLIENT", "KILL", "USER", user)  # its open connections (none is fine)
    admin.execute_command("ACL", "DELUSER", user)
    _save(admin)
    return True


def worker_users(admin: Any) -> list[str]:
    """The worker users the server has now."""
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in admin.execute_command("ACL", "USERS")]
    return [name for name in names if _NAME.match(name)]


def worker_connections(admin: Any) -> int:
    """How many connections worker users have open now."""
    clients = admin.client_list()
    return sum(1 for client in clients if _NAME.match(str(client.get("user", ""))))


def revoke_all_workers(admin: Any, grace_s: float = 0.0, poll_s: float = 1.0) -> int:
    """Revoke every worker user (the run has ended), after waiting up to `grace_s` for their connections to close
    (the workers read that the run ended and stop by themselves); how many users there were."""
    import time

    deadline = time.monotonic() + grace_s
    while worker_connections(admin) and time.monotonic() + poll_s <= deadline:
        time.sleep(poll_s)
    users = worker_users(admin)
    for user in users:
        revoke_worker(admin, user)
    return len(users)


def with_user(queue_url: str, user: str) -> str:
    """`queue_url` (no password) with `user` as its user: a worker job's queue URL."""
    from urllib.parse import urlsplit, urlunsplit

    parsed = urlsplit(queue_url)
    return urlunsplit(parsed._replace(netloc=f"{user}@{parsed.netloc.rsplit('@', 1)[-1]}"))


def grant_worker_at(queue_url: str, env: Mapping[str, str], user: str, replaces: str | None = None) -> None:
    """Grant worker user `user` on the Redis of `queue_url` as the coordinator, first revoking `replaces` (the user
    of an earlier job in the same slot, no longer running): the password and the run's CA (and a client
    certificate, for mutual TLS) come from `env`, as redis_address reads them (the launcher's secrets)."""
    from resources.queue.redis_streams import redis_client  # lazy: pulls redis
    from resources.urls import redis_address

    address = redis_address(queue_url, env)
    if not address.password:
        raise ValueError("granting a worker user needs the coordinator's password (SPOTLIGHT_REDIS_PASSWORD)")
    admin = redis_client(address, socket_connect_timeout=10, socket_timeout=10)
    try:
        if replaces is not None and replaces != user:
            revoke_worker(admin, replaces)
        grant_worker(admin, user, worker_password(address.password, user))
    finally:
        admin.close()


def _save(admin: Any) -> None:
    """ACL SAVE when the server was started with an aclfile (the reserved node's); a config without one refuses it."""
    import redis

    try:
        admin.execute_command("ACL", "SAVE")
    except redis.exceptions.ResponseError as err:
        if "acl file" not in str(err).lower():  # "not configured to use an ACL file"
            raise


def main(argv: list[str] | None = None) -> int:
    """Grant or revoke worker users on the node's Redis, as its coordinator (SPOTLIGHT_REDIS_PASSWORD): no secret on
    the command line, a worker's password is derived from the name."""
    from resources.queue.redis_streams import redis_client
    from resources.urls import redis_address

    parser = argparse.ArgumentParser(prog="python -m resources.queue.redis_acl", description=main.__doc__)
    parser.add_argument("--queue", required=True, help="The node's queue URL, rediss://127.0.0.1:PORT/0.")
    parser.add_argument("action", choices=("grant", "revoke", "revoke-all", "list"))
    parser.add_argument("users", nargs="*", help="worker user names (grant, revoke)")
    parser.add_argument("--grace-s", type=float, default=0.0, help="revoke-all: first wait this long for workers to go")
    args = parser.parse_args(argv)
    address = redis_address(args.queue)
    if not address.password:
        print("resources.queue.redis_acl: set SPOTLIGHT_REDIS_PASSWORD (the coordinator's)", file=sys.stderr)
        return 2
    admin = redis_client(address, socket_connect_timeout=10)
    try:
        for user in args.users if args.action in ("grant", "revoke") else ():
            if args.action == "grant":
                grant_worker(admin, user, worker_password(address.password, user))
            else:
                revoke_worker(admin, user)
        if args.action == "revoke-all":
            print(f"revoked {revoke_all_workers(admin, args.grace_s)} worker users")
        if args.action == "list":
            print("\n".join(worker_users(admin)))
    except ValueError as err:
        print(f"resources.queue.redis_acl: {err}", file=sys.stderr)
        return 2
    finally:
        admin.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
