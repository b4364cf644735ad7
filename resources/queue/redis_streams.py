"""RedisQueue: the request queue on Redis Streams consumer groups, for workers on many machines."""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from resources.queue import redis_lua as lua
from resources.queue.base import QueueConfig, QueueError, QueueUnavailableError, RedisAddress, RequestQueue
from resources.queue.records import (
    KINDS_BY_PRIORITY,
    DeadLetter,
    Lease,
    QueueStats,
    Request,
    check_lease_s,
    check_result_key,
    check_worker_id,
)
from resources.queue.redis_certs import SERVER_NAME
from resources.queue.redis_server import check_server_version

_CHUNK = 500
EVENTS_MAXLEN = 1_000_000
"""Worker events kept in the stream (about 200 bytes each); older ones are trimmed."""


class RedisQueue(RequestQueue):
    """Requests are entries of one stream per kind, read through the consumer group `workers`.

    claim = XCLAIM of the lease that ran out first (a sorted set of lease ends), else
    XREADGROUP of a new entry (highest priority stream first); heartbeat = a new lease end;
    ack = XACK + XDEL and a result key in a hash. Each operation is one function of the library
    in resources/queue/redis_lua.py (FCALL), so it is atomic and one round trip. Lease times use
    the server's clock (`TIME` in the functions), so worker clocks may disagree by any amount.

    A lost connection (a Redis restart) is retried with capped exponential backoff for up
    to `config.reconnect_s`; then QueueUnavailableError names the address. Run the server
    with `appendonly yes` so that a restart keeps the queue.
    """

    def __init__(self, address: RedisAddress, config: QueueConfig = QueueConfig()) -> None:
        self.address = address
        self.config = config
        self._redis = redis_client(
            address,
            socket_connect_timeout=config.connect_timeout_s,
            socket_timeout=max(10.0, config.connect_timeout_s),
            # Retries cover dropped connections. A retried script may run twice: put and ack are
            # idempotent, and a doubly claimed request just waits for its orphaned lease to expire.
            retry=Retry(ExponentialBackoff(cap=0.5, base=0.05), retries=3),
            decode_responses=True,
        )
        self._keys = lua.queue_keys()
        self._events_key = f"{lua.PREFIX}:worker_events"
        self._info_key = f"{lua.PREFIX}:run_info"
        self._create_groups()
        self._run("ADOPT", [])

    @property
    def url(self) -> str:
        return self.address.url

    def __repr__(self) -> str:
        return f"RedisQueue({self.url!r})"

    def close(self) -> None:
        self._redis.close()

    @contextmanager
    def _errors(self, op: str) -> Iterator[None]:
        where = f"{self.address.host}:{self.address.port}/{self.address.db}"
        try:
            yield
        except redis.exceptions.AuthenticationError as err:
            raise QueueUnavailableError(
                f"Redis at {where} rejected the credentials during {op} ({err}): put the server's password "
                "in SPOTLIGHT_REDIS_PASSWORD, or in a file named by SPOTLIGHT_REDIS_PASSWORD_FILE"
            ) from err
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as err:
            hint = " (a TLS server? use rediss://)" if not self.address.tls and "Connection reset" in str(err) else ""
            if "CERTIFICATE_VERIFY_FAILED" in str(err):
                hint = (
                    " (its TLS certificate is not signed by a CA this process trusts: a run's spot workers need "
                    "SPOTLIGHT_REDIS_RUN_CA, the run's CA, as spotlight launch sets it)"
                )
            raise QueueUnavailableError(
                f"cannot reach the Redis queue at {where}{hint} during {op} "
                f"(connect timeout {self.config.connect_timeout_s:g} s): {err}"
            ) from err
        except redis.exceptions.ResponseError as err:
            raise QueueError(f"Redis at {where} refused {op}: {err}") from err

    def _create_groups(self) -> None:
        """Check the server's version, load the queue's functions (an admin) or check they are this code's (a
        worker), and create the consumer groups (an admin; a worker finds them made)."""
        with self._errors("connect"):
            check_server_version(_hello_version(self._redis.execute_command("HELLO")))
            admin = self._load_functions()
            for stream in self._keys[:3] if admin else ():
                try:
                    self._redis.xgroup_create(stream, "workers", id="0", mkstream=True)
                except redis.exceptions.ResponseError as err:
                    if "BUSYGROUP" not in str(err):  # another process created it first
                        raise

    def _load_functions(self) -> bool:
        """FUNCTION LOAD REPLACE the library: True. A user without FUNCTION (a worker) waits instead, up to
        `config.reconnect_s`, until the server has the library (the coordinator loads it when it opens the queue),
        checks that it is this code's version, and returns False; QueueError saying what to do when it is not."""
        try:
            self._redis.function_load(lua.LIBRARY, replace=True)
            return True
        except redis.exceptions.NoPermissionError:
            pass
        deadline = time.monotonic() + self.config.reconnect_s
        while (loaded := self._loaded_version()) is None and time.monotonic() < deadline:
            time.sleep(0.5)
        if loaded != lua.VERSION:
            where = f"{self.address.host}:{self.address.port}/{self.address.db}"
            found = "no queue functions" if loaded is None else f"queue functions of version {loaded}"
            raise QueueError(
                f"the Redis queue at {where} has {found} and this code needs version {lua.VERSION}: the coordinator "
                "loads them when it opens the queue; start the reserved node's run (or relaunch it from this "
                "checkout) before the workers"
            )
        return False

    def _loaded_version(self) -> str | None:
        """The version of the queue's library on the server, None when it has none."""
        try:
            return self._redis.fcall_ro(lua.function_name("version"), 0)
        except redis.exceptions.ResponseError as err:
            if "not found" not in str(err).lower():
                raise
            return None

    def _run(self, name: str, args: list[Any]) -> Any:
        op = name.lower()
        return self._retrying(op, lambda: self._fcall(op, args))

    def _fcall(self, op: str, args: list[Any]) -> Any:
        """FCALL (FCALL_RO for a read-only function) of the queue's function `op`; a server that lost its functions
        (restarted without its data) gets them again from an admin, and a worker is told why it cannot go on."""
        call = self._redis.fcall_ro if op in lua.READ_ONLY else self._redis.fcall
        try:
            return call(lua.function_name(op), len(self._keys), *self._keys, *args)
        except redis.exceptions.ResponseError as err:
            if "function not found" not in str(err).lower():
                raise
        self._load_functions()
        return call(lua.function_name(op), len(self._keys), *self._keys, *args)

    def _retrying(self, op: str, work: Callable[[], Any]) -> Any:
        """One round trip; a lost connection is retried until `config.reconnect_s` has passed (a restarting
        server). A retried script may have run once already: put, heartbeat and ack are idempotent (an ack
        carries its lease's token), and a claim whose reply was lost only leaves a lease that runs out."""
        deadline = time.monotonic() + self.config.reconnect_s
        delay_s = 0.05
        while True:
            try:
                with self._errors(op):
                    return work()
            except QueueUnavailableError as err:
                cause = err.__cause__
                lost = isinstance(
                    cause, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)
                ) and not isinstance(cause, redis.exceptions.AuthenticationError)
                if not lost:
                    raise
                if time.monotonic() + delay_s > deadline:
                    where = f"{self.address.host}:{self.address.port}/{self.address.db}"
                    raise QueueUnavailableError(
                        f"the Redis queue at {where} stayed unreachable for {self.config.reconnect_s:g} s during {op} "
                        f"(QueueConfig.reconnect_s): {cause}. Check that redis-server is running there and reachable "
                        "from this machine"
                    ) from cause
            time.sleep(delay_s * random.uniform(0.5, 1.0))  # jitter: reconnecting workers do not arrive in step
            delay_s = min(2 * delay_s, 1.0)

    def put(self, requests: Iterable[Request | Mapping[str, Any]]) -> int:
        rows = [Request.from_dict(r) for r in requests]
        added = 0
        for start in range(0, len(rows), _CHUNK):
            args: list[Any] = []
            for r in rows[start : start + _CHUNK]:
                args += [r.request_id, r.kind, r.iteration, r.to_json()]
            added += int(self._run("PUT", args))
        return added

    def claim(self, worker_id: str, lease_s: float) -> Lease | None:
        check_worker_id(worker_id)
        lease_s = check_lease_s(lease_s, self.config.max_lease_s)
        found = self._run("CLAIM", [worker_id, _ms(lease_s), self.config.max_deliveries])
        if not found:
            return None
        entry, body, deliveries = found
        return Lease(Request.from_json(body), worker_id, int(deliveries), lease_s, entry)

    def heartbeat(self, lease: Lease) -> bool:
        return self._extend(lease, _ms(lease.lease_s))

    def release(self, lease: Lease) -> bool:
        return self._extend(lease, 0)

    def _extend(self, lease: Lease, lease_ms: int) -> bool:
        args = [lease.request.kind, lease.token, lease.worker_id, lease.attempts, lease_ms, lease.request_id]
        return self._run("EXTEND", args) == 1

    def ack(self, lease: Lease | str, result_key: str) -> bool:
        request_id = lease.request_id if isinstance(lease, Lease) else lease
        # One token per call, sent again by a retry: a retried ack whose reply was lost is still this call's.
        return self._run("ACK", [request_id, check_result_key(result_key), uuid.uuid4().hex]) == 1

    def purge_finished(self, before_iteration: int) -> int:
        """Forget the acked requests of iterations < `before_iteration`; returns how many (see SqliteQueue's)."""
        if isinstance(before_iteration, bool) or not isinstance(before_iteration, int):
            raise ValueError(f"before_iteration must be an int, got {before_iteration!r}")
        purged = 0
        while (n := int(self._run("PURGE", [before_iteration, _CHUNK]))) > 0:
            purged += n
        return purged

    def cancel_iteration(self, iteration: int, kind: str | None = None) -> int:
        if kind is not None and kind not in KINDS_BY_PRIORITY:
            raise ValueError(f"kind must be one of {KINDS_BY_PRIORITY} or None, got {kind!r}")
        return int(self._run("CANCEL", [int(iteration), kind or ""]))

    def stats(self) -> QueueStats:
        return QueueStats(*(int(n) for n in self._run("STATS", [])))

    def states(self, request_ids: Iterable[str]) -> dict[str, str]:
        ids = list(request_ids)
        out: dict[str, str] = {}
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            out.update(zip(chunk, self._run("STATES", chunk), strict=False))
        return out

    def results(self, request_ids: Iterable[str]) -> dict[str, str]:
        ids = list(request_ids)
        out: dict[str, str] = {}
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start : start + _CHUNK]
            keys = self._retrying("results", lambda chunk=chunk: self._redis.hmget(self._keys[5], chunk))
            out.update((rid, key) for rid, key in zip(chunk, keys, strict=False) if key is not None)
        return out

    def append_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        """Append remote workers' JSON events to the queue's event stream (resources/cluster/worker_events.py)."""
        with self._errors("append_events"), self._redis.pipeline(transaction=False) as pipe:
            for event in events:
                pipe.xadd(
                    self._events_key, {"json": json.dumps(event, default=str)}, maxlen=EVENTS_MAXLEN, approximate=True
                )
            pipe.execute()

    def read_events(self, after: str = "0", block_s: float = 0.5, count: int = 1000) -> tuple[str, list[dict]]:
        """Events appended after stream id `after` (waiting up to `block_s` for one): (last id, events)."""
        with self._errors("read_events"):
            found = self._redis.xread({self._events_key: after}, count=count, block=max(1, round(block_s * 1000)))
        entries = found[0][1] if found else []
        return (entries[-1][0] if entries else after), [json.loads(fields["json"]) for _, fields in entries]

    def publish_info(self, info: Mapping[str, Any]) -> None:
        """The coordinator's summary of the run (iteration, score, spend, cap) for `spotlight status` and the spot
        workers' spend gate, which cannot read the ledger on the reserved node."""
        with self._errors("publish_info"):
            self._redis.hset(self._info_key, mapping={k: json.dumps(v) for k, v in info.items()})

    def info(self) -> dict[str, Any]:
        """What `publish_info` last wrote ({} before the coordinator started)."""
        with self._errors("info"):
            return {k: json.loads(v) for k, v in self._redis.hgetall(self._info_key).items()}

    def dead_letters(self) -> list[DeadLetter]:
        with self._errors("dead_letters"):
            entries = self._redis.xrange(self._keys[6])
        return [DeadLetter(Request.from_json(fields["body"]), int(fields["attempts"])) for _, fields in entries]


class RunCaConnection(redis.connection.SSLConnection):
    """TLS that trusts the run's own CA and nothing else (not the system's CAs), and checks that the server's
    certificate names SERVER_NAME: the certificate was made before the node had an address. With a client
    certificate (a queue that requires one: mutual TLS) it presents it.

    redis-py has no public option for "this CA alone and this name, whatever the host": `_wrap_socket_with_ssl`
    (redis-py >= 5.1) is the one place to build the SSLContext; tests/resources/test_redis_tls_hook.py fails if a
    redis-py release drops or stops calling it."""

    def __init__(self, *, ssl_client_pem: tuple[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client_pem = ssl_client_pem

    def _wrap_socket_with_ssl(self, sock):
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verify_mode CERT_REQUIRED, check_hostname on, no CAs
        context.load_verify_locations(cadata=self.ca_data)
        if self.client_pem is not None:
            _load_client_pem(context, *self.client_pem)
        return context.wrap_socket(sock, server_hostname=SERVER_NAME)


def _load_client_pem(context: Any, cert_pem: str, key_pem: str) -> None:
    """Load a certificate and key given as PEM text: the ssl module reads them from files only, so they pass through
    a private temporary file (0600, in a 0700 folder) that is removed at once."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="spotlight-tls-") as folder:
        path = Path(folder) / "client.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(cert_pem + "\n" + key_pem)
        context.load_cert_chain(path)


def redis_client(address: RedisAddress, **options: Any) -> redis.Redis:
    """A redis-py client for `address`: plain, TLS checked against the system's CAs (or SPOTLIGHT_REDIS_CA_FILE)
    with the host name, or TLS pinned to the run's own CA (SPOTLIGHT_REDIS_RUN_CA, RunCaConnection)."""
    where = {
        "host": address.host,
        "port": address.port,
        "db": address.db,
        "username": address.username,
        "password": address.password,
    }
    if address.tls and address.run_ca is not None:
        client_pem = (address.client_cert, address.client_key) if address.client_cert and address.client_key else None
        pool = redis.ConnectionPool(
            connection_class=RunCaConnection,
            ssl_ca_data=address.run_ca,
            ssl_client_pem=client_pem,
            **where,
            **options,
        )
        return redis.Redis(connection_pool=pool)
    return redis.Redis(**where, **options, **tls_options(address))


def tls_options(address: RedisAddress) -> dict[str, Any]:
    """rediss://: TLS with the server's certificate and host name checked (against SPOTLIGHT_REDIS_CA_FILE if set)."""
    if not address.tls:
        return {}
    return {"ssl": True, "ssl_cert_reqs": "required", "ssl_check_hostname": True, "ssl_ca_certs": address.ca_file}


def _hello_version(reply: Any) -> str:
    """The server's version from a HELLO reply (a dict in redis-py's newer releases, a flat list in older ones)."""
    if isinstance(reply, (list, tuple)):
        reply = dict(zip(reply[::2], reply[1::2], strict=False))
    version = reply.get("version", reply.get(b"version", ""))
    return version.decode() if isinstance(version, bytes) else str(version)


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000)) if seconds > 0 else 0
