"""The `spotlight reward-serve` command: one reward behind HTTP(S) + JSON, so a reward model runs on its own GPU.

The protocol (POST /score, GET /health, the optional bearer token) is written down with its client in
workers/task/rewards_remote.py; a request is read in workers/task/reward_requests.py (sizes from PNG headers
before any pixel is decoded) and served by resources/reward_server.py (aiohttp: one deadline per request, size
limits, bounded decoding, one batch scored at a time, bounded connections, TLS). Only typer at import time:
`--help` stays instant.

Example:
    export SPOTLIGHT_REWARD_TOKEN=$(openssl rand -hex 24)   # required off loopback, on the clients too
    spotlight reward-serve --reward clip:/models/PickScore_v1,processor=/models/CLIP-H --host 0.0.0.0 --port 8200 \\
        --tls-cert /etc/spotlight/reward.pem --tls-key /etc/spotlight/reward.key
    spotlight train --reward 'https://reward-node:8200?ca_file=/etc/spotlight/ca.pem' ...
"""

from __future__ import annotations

import math
import os

import typer

from resources.reward_limits import ImageLimits, ServeLimits


def score_answer(reward_fn, request) -> dict:
    """The /score answer for one decoded request: its rewards (and a multi-reward's components), all finite."""
    from workers.task.rewards import score_with_components

    total, parts = score_with_components(reward_fn, request.images_NHW3, request.prompts, request.fields)
    if not all(math.isfinite(r) for r in total):
        raise RuntimeError(f"the reward returned non-finite values: {total.tolist()[:8]}")
    answer: dict = {"rewards": total.tolist()}
    if parts:
        answer["components"] = {name: values.tolist() for name, values in parts.items()}
    return answer


def reward_server(address, reward_fn, spec: str, limits=None, image_limits=None, token=None, ssl_context=None):
    """A RewardServer (resources/reward_server.py) for one reward: requests read within `image_limits`, scored
    with `reward_fn`; ValueError when it may not serve there (off loopback without a token)."""
    import functools

    from resources.reward_server import RewardServer
    from workers.task.rewards_remote import PROTOCOL

    decode = functools.partial(_read, image_limits or ImageLimits())
    score = functools.partial(score_answer, reward_fn)
    health = {"status": "ok", "reward": spec, "protocol": PROTOCOL}
    return RewardServer(address, decode, score, health, limits or ServeLimits(), token, ssl_context)


def _read(image_limits, body, deadline):
    """The server's `decode`: the request read within `image_limits` (workers/task/reward_requests.py)."""
    from workers.task.reward_requests import read_scoring_request

    return read_scoring_request(body, image_limits, deadline)


def reward_serve_command(
    reward: str = typer.Option(
        ..., help="Reward spec to serve: a name, clip:PATH[,processor=PATH], multi:... (workers/task/rewards.py)."
    ),
    host: str = typer.Option(
        "127.0.0.1",
        help="Address to listen on; 0.0.0.0 to serve other machines (on a private network; "
        "$SPOTLIGHT_REWARD_TOKEN must then be set here and on the clients).",
    ),
    port: int = typer.Option(8200, help="Port; 0 picks a free one (the URL is printed)."),
    max_images: int = typer.Option(ImageLimits.max_images, help="Most images one request may carry."),
    max_request_mb: float = typer.Option(
        ServeLimits.max_request_bytes / (1 << 20), help="Largest request body, in MiB (Content-Length and streamed)."
    ),
    max_pixels: int = typer.Option(
        ImageLimits.max_pixels,
        help="Largest image (width x height), read from its PNG header before anything is decoded.",
    ),
    max_request_pixels: int = typer.Option(
        ImageLimits.max_request_pixels,
        help="Most pixels in one request (all its images), read from the PNG headers before decoding.",
    ),
    deadline_s: float = typer.Option(
        ServeLimits.deadline_s,
        "--deadline-s",
        "--timeout-s",
        help="Seconds a whole request may take (headers, body, decoding, scoring); then a 408 or 503, and it is cut.",
    ),
    header_timeout_s: float = typer.Option(
        ServeLimits.header_timeout_s,
        help="Seconds for the TLS handshake and then the headers, before the token is checked.",
    ),
    max_connections: int = typer.Option(
        ServeLimits.max_connections, help="Connections served at once; the next ones get a 503 at once."
    ),
    decode_concurrency: int = typer.Option(
        ServeLimits.decode_concurrency, help="Requests decoded at once, each on a thread; scoring is one at a time."
    ),
    tls_cert: str = typer.Option("", help="PEM certificate (chain) to serve HTTPS with; needs --tls-key."),
    tls_key: str = typer.Option("", help="PEM private key of --tls-cert (not readable by every user)."),
) -> None:
    """Serve a reward over HTTP(S) + JSON (POST /score, GET /health) for `--reward http(s)://HOST:PORT` clients."""
    from resources.reward_http import REWARD_TOKEN_ENV
    from resources.reward_server import is_loopback, server_ssl_context
    from workers.task.rewards import get_reward

    token = os.environ.get(REWARD_TOKEN_ENV) or None
    if not 0 <= port <= 65535:
        raise typer.BadParameter(f"--port must be in 0..65535, got {port}")
    if not is_loopback(host) and not token:
        raise typer.BadParameter(
            f"serving on {host} (not loopback) needs a token: set ${REWARD_TOKEN_ENV} here and on the "
            "clients (e.g. export SPOTLIGHT_REWARD_TOKEN=$(openssl rand -hex 24))",
            param_hint="--host",
        )
    if bool(tls_cert) != bool(tls_key):
        raise typer.BadParameter("--tls-cert and --tls-key go together: pass both, or neither for plain HTTP")
    try:
        limits = ServeLimits(
            deadline_s=deadline_s,
            header_timeout_s=header_timeout_s,
            max_connections=max_connections,
            max_request_bytes=int(max_request_mb * (1 << 20)),
            decode_concurrency=decode_concurrency,
        )
        image_limits = ImageLimits(max_images, max_pixels, max_request_pixels)
        ssl_context = server_ssl_context(tls_cert, tls_key) if tls_cert else None
        reward_fn = get_reward(reward)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    load = getattr(reward_fn, "load", None)
    if callable(load):
        load()  # a big model loads now, not inside the first client's deadline
    try:
        server = reward_server((host, port), reward_fn, reward, limits, image_limits, token, ssl_context)
    except (ValueError, OSError) as err:
        raise typer.BadParameter(f"cannot serve on {host}:{port}: {err}") from None
    scheme = "https" if ssl_context else "http"
    typer.echo(f"spotlight reward-serve: {reward} on {scheme}://{host}:{server.server_port} (POST /score, GET /health)")
    if not ssl_context and not is_loopback(host):
        typer.echo(
            f"spotlight reward-serve: plain HTTP on {host}: ${REWARD_TOKEN_ENV} crosses the network in clear; keep it "
            "on a private network, or serve HTTPS with --tls-cert/--tls-key",
            err=True,
        )
    try:
        server.serve_forever(
            handle_signals=True
        )  # SIGTERM (docker stop, SkyPilot, a supervisor) ends it as Ctrl-C does
    finally:
        server.server_close()
