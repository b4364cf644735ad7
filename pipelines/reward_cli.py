"""The `spotlight reward-serve` command: one reward behind HTTP + JSON, so a reward model runs on its own GPU.

The protocol (POST /score, GET /health, the optional bearer token) is written down with its client in
workers/task/rewards_remote.py. Requests are served on threads (decoding PNGs in parallel) and scored
one batch at a time: a GPU model is not re-entrant. Only typer at import time: `--help` stays instant.

Example:
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


class RewardServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer holding one reward function; `server_port` is the bound port (useful with port 0)."""

    daemon_threads = True  # a stuck request never keeps the process alive after shutdown

    def __init__(self, address: tuple[str, int], reward_fn, spec: str, max_images: int = 256,
                 max_request_bytes: int = 512 << 20, token: str | None = None):
        super().__init__(address, RewardHandler)
        self.reward_fn, self.spec, self.token = reward_fn, spec, token
        self.max_images, self.max_request_bytes = max_images, max_request_bytes
        self.score_lock = threading.Lock()


class RewardHandler(BaseHTTPRequestHandler):
    server: RewardServer

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
            return self._send(413, {"error": f"the request has {length} bytes; this server takes at most "
                                             f"{self.server.max_request_bytes} (send fewer images per request)"})
        try:
            images, prompts, fields = decode_scoring_request(self.rfile.read(int(length)), self.server.max_images)
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
    reward: str = typer.Option(..., help="Reward spec to serve: a name, clip:PATH[,processor=PATH], multi:... "
                                         "(workers/task/rewards.py)."),
    host: str = typer.Option("127.0.0.1", help="Address to listen on; 0.0.0.0 to serve other machines (on a private "
                                              "network, with $SPOTLIGHT_REWARD_TOKEN set here and on the clients)."),
    port: int = typer.Option(8200, help="Port; 0 picks a free one (the URL is printed)."),
    max_images: int = typer.Option(256, help="Most images one request may carry."),
    max_request_mb: float = typer.Option(512.0, help="Largest request body, in MiB."),
) -> None:
    """Serve a reward over HTTP + JSON (POST /score, GET /health) for `--reward http://HOST:PORT` clients."""
    from workers.task.rewards import get_reward
    from workers.task.rewards_remote import TOKEN_ENV

    if max_images < 1 or max_request_mb <= 0 or not 0 <= port <= 65535:
        raise typer.BadParameter("need --max-images >= 1, --max-request-mb > 0 and --port in 0..65535")
    try:
        reward_fn = get_reward(reward)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--reward") from None
    load = getattr(reward_fn, "load", None)
    if callable(load):
        load()  # a big model loads now, not inside the first client's timeout
    server = RewardServer((host, port), reward_fn, reward, max_images, int(max_request_mb * (1 << 20)),
                          os.environ.get(TOKEN_ENV) or None)
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
