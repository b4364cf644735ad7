"""The reward server's HTTP layer: aiohttp's low-level server, bounded in time, size, concurrency and connections.

- **One deadline per request.** From the moment its connection is made (after the TLS handshake, which is itself
  cut after `header_timeout_s`), the headers, the body, decoding and scoring together get `deadline_s`. A request
  still arriving then gets a 408, one still waiting on the server a 503, and the connection is closed: the clock
  counts the whole request, not each read, so a client that trickles a byte at a time is cut all the same.
- **Headers first, then the token.** The headers alone get `header_timeout_s`; the bearer token is checked (in
  constant time) as soon as they are in, before any body is read, so a client without it holds a connection for
  at most `header_timeout_s`.
- **Sizes.** The body is refused (413) from its Content-Length and, while it streams, past `max_request_bytes`;
  what the body means (and its pixel budget) is `decode`'s business, which raises RequestTooLarge for a 413.
- **Bounded work.** `decode(body, deadline)` runs on `decode_concurrency` threads behind a semaphore of the same
  size; `score(batch)` runs one at a time (a GPU model is not re-entrant). A request past its deadline gives up
  its place; work already running on a thread finishes there, and is thrown away.
- **Bounded connections.** Past `max_connections`, a new connection gets a 503 at once and is closed.

Example:
    server = RewardServer(("0.0.0.0", 8200), decode, score, {"status": "ok"}, ServeLimits(), token=token)
    server.serve_forever(handle_signals=True)   # or in a thread, then server.shutdown() and server.server_close()
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import os
import signal
import socket
import ssl
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from resources.reward_http import REWARD_TOKEN_ENV, RequestTooLarge
from resources.reward_limits import ServeLimits

GRACE_S = 0.25
"""How long past its deadline a connection is kept: long enough for its 408/503 to reach the client (a close with
unread input resets the connection), then it is cut, answered or not."""
LINGER_S = 1.0
"""After an early answer (a 413, a 401), the rest of the body is read and dropped this long, so a client still
sending hears the answer instead of a reset."""
BACKLOG = 128
"""The listen backlog: a burst of clients waits to be accepted, then meets max_connections."""
LOOPBACK_HOSTS = ("localhost", "ip6-localhost")


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, other machines may reach it


def server_ssl_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    """TLS 1.2 or later with this certificate chain and key; ValueError naming the file and the fix when one is
    missing, unusable, or the key is readable by every user."""
    for flag, path in (("--tls-cert", cert_file), ("--tls-key", key_file)):
        if not os.path.isfile(path):
            raise ValueError(f"{flag} {path}: no such file")
    if os.stat(key_file).st_mode & 0o007:
        raise ValueError(f"--tls-key {key_file} is readable by every user: `chmod 600 {key_file}`")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert_file, key_file)
    except (ssl.SSLError, OSError) as err:
        raise ValueError(
            f"--tls-cert {cert_file} / --tls-key {key_file}: not a certificate and its key ({err})"
        ) from None
    return context


@dataclass
class _Clock:
    """One connection's time: when it was made, whether its headers are in, and what its request is doing."""

    made_at: float
    transport: asyncio.Transport
    timer: asyncio.TimerHandle | None = None
    headers_in: bool = False
    phase: str = "sending its headers"


def _raw_answer(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP answer, written straight to a connection that has no request handler (yet)."""
    body = json.dumps({"error": message}).encode()
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nConnection: close\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


class _GuardedServer(web.Server):
    """aiohttp's protocol factory, with the connection cap and a clock started for each connection."""

    def __init__(self, handler, limits: ServeLimits):
        super().__init__(
            handler,
            handler_cancellation=True,  # a connection cut (or gone) cancels its handler and the work it queued
            lingering_time=LINGER_S,
            auto_decompress=False,  # a gzip body would be a decompression bomb: JSON arrives as it is sent
            access_log=None,
        )
        self.limits = limits
        self.clocks: dict[Any, _Clock] = {}

    def connection_made(self, handler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self.clocks) >= self.limits.max_connections:
            transport.write(_raw_answer(503, "Service Unavailable", "the reward server is at its connection limit"))
            transport.close()
            return
        loop = asyncio.get_running_loop()
        clock = _Clock(loop.time(), transport)
        clock.timer = loop.call_at(clock.made_at + self.limits.header_timeout_s, self._headers_due, handler)
        self.clocks[handler] = clock

    def connection_lost(self, handler, exc: BaseException | None = None) -> None:
        clock = self.clocks.pop(handler, None)
        if clock is not None and clock.timer is not None:
            clock.timer.cancel()
        super().connection_lost(handler, exc)

    def _headers_due(self, handler) -> None:
        clock = self.clocks.get(handler)
        if clock is None or clock.transport.is_closing():
            return
        if clock.headers_in:  # the handler keeps the deadline from here; this is the backstop if it overruns
            when = clock.made_at + self.limits.deadline_s + GRACE_S
            clock.timer = asyncio.get_running_loop().call_at(when, clock.transport.abort)
            return
        message = f"the request's headers did not arrive within {self.limits.header_timeout_s:g} s"
        clock.transport.write(_raw_answer(408, "Request Timeout", message))
        clock.transport.close()


class RewardServer:
    """`decode` and `score` behind HTTP(S) on one listening socket (bound here: `server_port` is known at once)."""

    def __init__(
        self,
        address: tuple[str, int],
        decode: Callable[[bytearray, float], Any],
        score: Callable[[Any], dict],
        health: dict,
        limits: ServeLimits = ServeLimits(),
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ):
        if not is_loopback(address[0]) and not token:
            raise ValueError(
                f"serving on {address[0]} (not loopback) needs a token: set ${REWARD_TOKEN_ENV} here and on "
                "the clients, or bind --host 127.0.0.1"
            )
        self.decode, self.score, self.health, self.limits = decode, score, health, limits
        self.ssl_context = ssl_context
        self._expected = hashlib.sha256(f"Bearer {token}".encode()).digest() if token else None
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.socket = socket.create_server(address, family=family, backlog=BACKLOG)
        self.server_port: int = self.socket.getsockname()[1]
        self._decode_pool = ThreadPoolExecutor(limits.decode_concurrency, thread_name_prefix="reward-decode")
        self._score_pool = ThreadPoolExecutor(1, thread_name_prefix="reward-score")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._lock = threading.Lock()  # shutdown() may come before serve_forever() has its loop
        self._stop_asked = False
        self._stopped = threading.Event()

    def serve_forever(self, handle_signals: bool = False) -> None:
        """Serve until shutdown() (or, with handle_signals, SIGTERM / SIGINT: call it from the main thread)."""
        try:
            asyncio.run(self._serve(handle_signals))
        finally:
            self._stopped.set()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop serve_forever from another thread, and wait until it has returned."""
        with self._lock:
            self._stop_asked = True
            loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not self._stopped.is_set():
            loop.call_soon_threadsafe(stop.set)
            self._stopped.wait(timeout_s)

    def server_close(self) -> None:
        """Close the listening socket and the thread pools (work still queued is dropped)."""
        self.socket.close()
        self._decode_pool.shutdown(wait=False, cancel_futures=True)
        self._score_pool.shutdown(wait=False, cancel_futures=True)

    async def _serve(self, handle_signals: bool) -> None:
        loop, stop = asyncio.get_running_loop(), asyncio.Event()
        with self._lock:
            if self._stop_asked:
                return
            self._loop, self._stop = loop, stop
        self._decode_slots = asyncio.Semaphore(self.limits.decode_concurrency)
        self._score_slot = asyncio.Semaphore(1)
        if handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
        self._web = _GuardedServer(self._handle, self.limits)
        handshake_s = self.limits.header_timeout_s if self.ssl_context else None
        listener = await loop.create_server(
            self._web, sock=self.socket, ssl=self.ssl_context, ssl_handshake_timeout=handshake_s, backlog=BACKLOG
        )
        try:
            await stop.wait()
        finally:
            listener.close()
            for clock in list(self._web.clocks.values()):
                clock.transport.abort()
            await self._web.shutdown(timeout=1.0)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        clock = self._web.clocks.get(request.protocol)
        if clock is None:  # refused at the connection cap: its 503 is already written
            raise web.HTTPServiceUnavailable()
        clock.headers_in = True
        deadline = clock.made_at + self.limits.deadline_s
        try:
            async with asyncio.timeout_at(deadline):
                status, payload = await self._route(request, clock, deadline)
        except TimeoutError:
            status, payload = self._late(clock)
        response = web.json_response(
            payload, status=status, headers={"WWW-Authenticate": "Bearer"} if status == 401 else None
        )
        response.force_close()  # one request per connection: its clock started when it was made
        return response

    async def _route(self, request: web.BaseRequest, clock: _Clock, deadline: float) -> tuple[int, dict]:
        path = request.path.rstrip("/")
        if (request.method, path) not in (("GET", "/health"), ("POST", "/score")):
            return 404, {"error": f"no {request.method} {request.path}: GET /health, POST /score"}
        if not self._authorized(request):
            return 401, {"error": f"missing or wrong bearer token (${REWARD_TOKEN_ENV})"}
        if path == "/health":
            return 200, self.health
        try:
            clock.phase = "sending its body"
            body = await self._read_body(request)
            clock.phase = "waiting to be decoded"
            async with self._decode_slots:
                clock.phase = "being decoded"
                batch = await asyncio.wrap_future(self._decode_pool.submit(self.decode, body, deadline))
        except ValueError as err:  # RequestTooLarge (a ValueError) included
            return 413 if isinstance(err, RequestTooLarge) else 400, {"error": str(err)}
        del body
        clock.phase = "waiting to be scored"
        async with self._score_slot:
            clock.phase = "being scored"
            try:
                return 200, await asyncio.wrap_future(self._score_pool.submit(self.score, batch))
            except ValueError as err:  # the reward refuses these inputs: the same request fails again
                return 400, {"error": str(err)}
            except Exception as err:  # noqa: BLE001 - the client must hear why (it retries a 500); traceback kept here
                traceback.print_exc(file=sys.stderr)
                return 500, {"error": f"the reward failed: {type(err).__name__}: {err}"}

    def _authorized(self, request: web.BaseRequest) -> bool:
        """The bearer token, compared in constant time (digests of equal length: not even its length leaks)."""
        if self._expected is None:
            return True
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
        return hmac.compare_digest(hashlib.sha256(given).digest(), self._expected)

    async def _read_body(self, request: web.BaseRequest) -> bytearray:
        limit = self.limits.max_request_bytes
        fix = f"this server takes at most {limit} bytes (send fewer images per request, or raise --max-request-mb)"
        if request.content_length is not None and request.content_length > limit:
            raise RequestTooLarge(f"the request has {request.content_length} bytes; {fix}")
        body = bytearray()
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > limit:
                raise RequestTooLarge(f"the request has more than {limit} bytes; {fix}")
        return body

    def _late(self, clock: _Clock) -> tuple[int, dict]:
        """A request past its deadline: 408 if the client was still sending, 503 (retried) if the server was slow."""
        whole = f"the server's deadline of {self.limits.deadline_s:g} s (headers, body, decoding and scoring together)"
        if clock.phase == "sending its body":
            return 408, {"error": f"the request did not arrive within {whole}"}
        return 503, {
            "error": f"the request was still {clock.phase} at {whole}: the server is busy or the request is large; "
            "retry, send fewer images per request, or start the server with a larger --deadline-s"
        }
