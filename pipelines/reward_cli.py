"""The `spotlight reward-serve` command: one reward behind HTTP + JSON, so a reward model runs on its own GPU.

The protocol (POST /score, GET /health, the optional bearer token) is written down with its client in
workers/task/rewards_remote.py. Requests are served on threads (decoding PNGs in parallel) and scored
one batch at a time: a GPU model is not re-entrant. Only typer at import time: `--help` stays instant.

Example:
    export SPOTLIGHT_REWARD_TOKEN=$(openssl rand -hex 24)   # required off loopback, on the clients too
    spotlight reward-serve --reward clip:/models/PickScore_v1,processor=/models/CLIP-H --host 0.0.0.0 --port 8200
    spotlight train --reward http://reward-node:8200 ...
"""

from __future__ import annotations

import hmac
import json
import math
import os
import sys
import threading
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import typer

LOOPBACK_HOSTS = ("localhost", "ip6-localhost")
_BUSY = b'{"error": "the reward server is at its connection limit; retry"}'
REFUSED_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
)
"""What a connection over the limit gets, written by the accepting thread (no handler thread is started for it)."""


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, other machines may reach it


class RewardServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer holding one reward function; `server_port` is the bound port (useful with port 0).

    Bounded: each connection has `timeout_s` to send its request (a client that stalls is dropped), at most
    `max_connections` are served at once (the next ones get a 503 at once), images are checked from their
    PNG header against `max_pixels` before any is decoded, and a token is required unless bound to loopback."""

    daemon_threads = True  # a stuck request never keeps the process alive after shutdown
    request_queue_size = 128  # the listen backlog: a burst of clients is accepted, then limited by max_connections

    def __init__(
        self,
        address: tuple[str, int],
        reward_fn,
        spec: str,
        max_images: int = 256,
        max_request_bytes: int = 512 << 20,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        max_connections: int = 64,
        max_pixels: int | None = None,
    ):
        from workers.task.rewards_remote import MAX_PIXELS, TOKEN_ENV

        if not is_loopback(address[0]) and not token:
            raise ValueError(
                f"serving on {address[0]} (not loopback) needs a token: set ${TOKEN_ENV} here and on "
                "the clients, or bind --host 127.0.0.1"
            )
        if not timeout_s > 0 or max_connections < 1 or (max_pixels is not None and max_pixels < 1):
            raise ValueError("need timeout_s > 0, max_connections >= 1 and max_pixels >= 1")
        super().__init__(address, RewardHandler)
        self.reward_fn, self.spec, self.token = reward_fn, spec, token
        self.max_images, self.max_request_bytes = max_images, max_request_bytes
        self.timeout_s, self.max_pixels = timeout_s, max_pixels or MAX_PIXELS
        self.slots = threading.BoundedSemaphore(max_connections)
        self.score_lock = threading.Lock()

    def process_request(self, request, client_address) -> None:
        """A thread per connection while a slot is free; at the limit, a 503 from the accepting thread, at once."""
        if not self.slots.acquire(blocking=False):
            try:
                request.settimeout(1.0)
                request.sendall(REFUSED_BUSY)
            except OSError:
                pass  # the client went away: nothing to tell it
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class RewardHandler(BaseHTTPRequestHandler):
    server: RewardServer

    def setup(self) -> None:
        self.timeout = self.server.timeout_s  # every read and write of this connection; a stalled client is dropped
        super().setup()

    def _send(self, code: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _authorized(self) -> bool:
        if self.server.token is None:
            return True
        given = self.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {self.server.token}".encode()):
            return True
        self._send(401, {"error": "missing or wrong bearer token ($SPOTLIGHT_REWARD_TOKEN)"})
        return False

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        from workers.task.rewards_remote import PROTOCOL

        if self.path.rstrip("/") != "/health":
            self._send(404, {"error": f"no {self.path}: GET /health, POST /score"})
        elif self._authorized():
            self._send(200, {"status": "ok", "reward": self.server.spec, "protocol": PROTOCOL})

    def do_POST(self) -> None:  # noqa: N802
        from workers.task.rewards_remote import decode_scoring_request

        if self.path.rstrip("/") != "/score":
            return self._send(404, {"error": f"no {self.path}: GET /health, POST /score"})
        if not self._authorized():
            return None
        length = self.headers.get("Content-Length", "")
        if not length.isdigit():
            return self._send(411, {"error": "send a Content-Length"})
        if int(length) > self.server.max_request_bytes:
            return self._send(
                413,
                {
                    "error": f"the request has {length} bytes; this server takes at most "
                    f"{self.server.max_request_bytes} (send fewer images per request)"
                },
            )
        try:
            body = self.rfile.read(int(length))
        except TimeoutError:
            self.close_connection = True
            return self._send(408, {"error": f"the request body did not arrive within {self.server.timeout_s:g} s"})
        if len(body) < int(length):
            self.close_connection = True
            return None  # the client hung up mid-body: nobody to answer
        try:
            images, prompts, fields = decode_scoring_request(body, self.server.max_images, self.server.max_pixels)
        except ValueError as err:
            return self._send(400, {"error": str(err)})
        return self._score(images, prompts, fields)

    def _score(self, images, prompts, fields=None) -> None:
        from workers.task.rewards import score_with_components

        try:
            with self.server.score_lock:
                total, parts = score_with_components(self.server.reward_fn, images, prompts, fields)
        except ValueError as err:  # the reward refuses these inputs: the same request fails again
            return self._send(400, {"error": str(err)})
        except Exception as err:  # noqa: BLE001 - the client must hear why (it retries a 500); traceback kept here
            traceback.print_exc(file=sys.stderr)
            return self._send(500, {"error": f"the reward failed: {type(err).__name__}: {err}"})
        if not all(math.isfinite(r) for r in total):
            return self._send(500, {"error": f"the reward returned non-finite values: {total.tolist()[:8]}"})
        answer = {"rewards": total.tolist()}
        if parts:
            answer["components"] = {name: values.tolist() for name, values in parts.items()}
        return self._send(200, answer)


def reward_serve_command(
    reward: str = typer.Option(
        ..., help="Reward spec to serve: a name, clip:PATH[,processor=PATH], multi:... (workers/task/rewards.py)."
    ),
    host: str = typer.Option(
        "127.0.0.1",
        help="Address to listen on; 0.0.0.0 to serve other machines (on a private "
        "network; $SPOTLIGHT_REWARD_TOKEN must then be set here and on the "
        "clients).",
    ),
    port: int = typer.Option(8200, help="Port; 0 picks a free one (the URL is printed)."),
    max_images: int = typer.Option(256, help="Most images one request may carry."),
    max_request_mb: float = typer.Option(512.0, help="Largest request body, in MiB."),
    max_pixels: int = typer.Option(
        4096 * 4096, help="Largest image (width x height), checked from its PNG header before it is decoded."
    ),
    timeout_s: float = typer.Option(
        30.0,
        "--timeout-s",
        help="Seconds a connection may take to send its request; a client that stalls longer is dropped.",
    ),
    max_connections: int = typer.Option(64, help="Connections served at once; the next ones get a 503 at once."),
) -> None:
    """Serve a reward over HTTP + JSON (POST /score, GET /health) for `--reward http://HOST:PORT` clients."""
    from workers.task.rewards import get_reward
    from workers.task.rewards_remote import TOKEN_ENV

    if max_images < 1 or max_request_mb <= 0 or not 0 <= port <= 65535:
        raise typer.BadParameter("need --max-images >= 1, --max-request-mb > 0 and --port in 0..65535")
    if not is_loopback(host) and not os.environ.get(TOKEN_ENV):
        raise typer.BadParameter(
            f"serving on {host} (not loopback) needs a token: set ${TOKEN_ENV} here and on the "
            "clients (e.g. export SPOTLIGHT_REWARD_TOKEN=$(openssl rand -hex 24))",
            param_hint="--host",
        )
    try:
        reward_fn = get_reward(reward)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--reward") from None
    load = getattr(reward_fn, "load", None)
    if callable(load):
        load()  # a big model loads now, not inside the first client's timeout
    try:
        server = RewardServer(
            (host, port),
            reward_fn,
            reward,
            max_images,
            int(max_request_mb * (1 << 20)),
            os.environ.get(TOKEN_ENV) or None,
            timeout_s=timeout_s,
            max_connections=max_connections,
            max_pixels=max_pixels,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    typer.echo(f"spotlight reward-serve: {reward} on http://{host}:{server.server_port} (POST /score, GET /health)")
    import signal

    def stop(signum, frame):  # SIGTERM (docker stop, SkyPilot, a supervisor) ends the server as Ctrl-C does,
        raise KeyboardInterrupt  # even where the parent left SIGTERM ignored

    signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
