"""An HTTP proxy between boto3 and a moto server that injects S3 faults on a schedule or at random.

Faults (the `kind` of `S3FaultProxy.inject`):

| kind | what the client sees |
|---|---|
| `500` | `500 InternalError` (an S3 error body) |
| `503` | `503 ServiceUnavailable` |
| `slowdown` | `503 SlowDown`: S3's throttling answer |
| `stall` | nothing for `stall_s` seconds (set it above the client's read timeout), then a closed connection |
| `reset` | the TCP connection reset (RST) before any byte of the answer |
| `partial` | the real status and headers, Content-Length included, then half the body and a closed connection |
| `corrupt` | the real answer with one byte of the body flipped (only a checksum can tell) |

`when="before"` faults a request without forwarding it (the server never sees it); `"after"`
forwards it first, so the server has acted (a PUT landed) and only the answer is lost.
`partial` and `corrupt` need the real answer and are always "after".

Example:
    with S3FaultProxy(s3_server.url) as proxy:
        proxy.inject("slowdown", times=3)                       # the next three requests
        proxy.inject("partial", times=1, method="GET")          # the next GET
        proxy.inject("500", probability=0.2, seed=7)            # one request in five, forever
        store = S3TensorStore(s3_server.bucket, "p", endpoint_url=proxy.url)
        ...
        assert proxy.injected["slowdown"] == 3
"""

from __future__ import annotations

import collections
import http.client
import http.server
import random
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

KINDS = ("500", "503", "slowdown", "stall", "reset", "partial", "corrupt")
_ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "ServiceUnavailable", "Service is unable to handle request."),
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}


@dataclass
class Rule:
    """One scheduled fault: which requests it hits and how often."""

    kind: str
    times: int | None
    """Requests left to fault; None = every matching request (subject to `probability`)."""
    probability: float = 1.0
    method: str | None = None
    path_contains: str | None = None
    when: str = "before"
    stall_s: float = 3.0
    rng: random.Random = field(default_factory=random.Random)

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and method != self.method:
            return False
        return self.path_contains is None or self.path_contains in path


class S3FaultProxy:
    """A threaded HTTP/1.1 proxy on 127.0.0.1 in front of `upstream` (a moto server URL)."""

    def __init__(self, upstream: str) -> None:
        parsed = urlparse(upstream)
        self.upstream_host, self.upstream_port = parsed.hostname, parsed.port
        self.rules: list[Rule] = []
        self.injected: collections.Counter[str] = collections.Counter()
        """Faults injected so far, by kind."""
        self.forwarded = 0
        """Requests that reached the upstream server."""
        self.requests: list[tuple[str, str]] = []
        """(method, path) of every request, in arrival order."""
        self.lock = threading.Lock()
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as boto3 uses it (and 100-continue for big PUTs)

            def log_message(self, *args: object) -> None:
                pass

            def _handle(self) -> None:
                proxy._serve(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # --- schedule -------------------------------------------------------------------------

    def inject(
        self,
        kind: str,
        *,
        times: int | None = 1,
        probability: float = 1.0,
        method: str | None = None,
        path_contains: str | None = None,
        when: str = "before",
        stall_s: float = 3.0,
        seed: int = 0,
    ) -> Rule:
        """Fault the next `times` matching requests (None: all of them), each with `probability`."""
        if kind not in KINDS:
            raise ValueError(f"fault kind {kind!r} is not one of {KINDS}")
        if when not in ("before", "after"):
            raise ValueError(f"when must be 'before' or 'after', got {when!r}")
        when = "after" if kind in ("partial", "corrupt") else when
        rule = Rule(kind, times, probability, method, path_contains, when, stall_s, random.Random(seed))
        with self.lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Stop injecting: every later request is forwarded untouched."""
        with self.lock:
            self.rules.clear()

    def _pick(self, method: str, path: str) -> Rule | None:
        with self.lock:
            self.requests.append((method, path))
            for rule in self.rules:
                if rule.times == 0 or not rule.matches(method, path):
                    continue
                if rule.rng.random() >= rule.probability:
                    continue
                if rule.times is not None:
                    rule.times -= 1
                self.injected[rule.kind] += 1
                return rule
        return None

    # --- serving ----------------------------------------------------------------------------

    def _serve(self, h: http.server.BaseHTTPRequestHandler) -> None:
        body = h.rfile.read(int(h.headers.get("Content-Length", 0) or 0))
        rule = self._pick(h.command, h.path)
        if rule is not None and rule.when == "before":
            self._fault_without_answer(h, rule)
            return
        status, headers, data = self._forward(h, body)
        if rule is None:
            self._answer(h, status, headers, data)
        elif rule.kind == "partial":
            self._answer(h, status, headers, data[: len(data) // 2], close=True)
        elif rule.kind == "corrupt":
            flipped = bytearray(data)
            if flipped:
                flipped[len(flipped) // 2] ^= 0x01
            self._answer(h, status, headers, bytes(flipped))
        else:
            self._fault_without_answer(h, rule)

    def _forward(self, h: http.server.BaseHTTPRequestHandler, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(self.upstream_host, self.upstream_port, timeout=60)
        try:
            headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP_BY_HOP}
            conn.request(h.command, h.path, body=body if body else None, headers=headers)
            response = conn.getresponse()
            data = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        finally:
            conn.close()
        with self.lock:
            self.forwarded += 1
        return response.status, kept, data

    def _answer(self, h, status: int, headers: list[tuple[str, str]], data: bytes, *, close: bool = False) -> None:
        h.send_response(status)
        for name, value in headers:
            h.send_header(name, value)  # Content-Length stays the upstream's: a partial body is detectably short
        if not any(k.lower() == "content-length" for k, _ in headers):
            h.send_header("Content-Length", str(len(data)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(data)
        h.wfile.flush()
        if close:
            h.close_connection = True

    def _fault_without_answer(self, h: http.server.BaseHTTPRequestHandler, rule: Rule) -> None:
        if rule.kind in _ERRORS:
            status, code, message = _ERRORS[rule.kind]
            error = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                f"<RequestId>injected-{rule.kind}</RequestId></Error>"
            ).encode()
            self._answer(h, status, [("Content-Type", "application/xml"), ("Content-Length", str(len(error)))], error)
            return
        if rule.kind == "stall":
            time.sleep(rule.stall_s)
        # reset (and the end of a stall): RST instead of an orderly close, nothing answered.
        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        h.close_connection = True
        h.connection.close()

    def __enter__(self) -> "S3FaultProxy":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
