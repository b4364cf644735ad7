"""The remote reward protocol's client (and wire format): a reward model served on its own GPUs over HTTP(S) + JSON.

Protocol 1 (`spotlight reward-serve`, pipelines/reward_cli.py, is the server; workers/task/reward_requests.py reads
its requests):
- `POST {url}/score` with `{"prompts": [str], "images": [base64 PNG, RGB]}` (and optionally `"fields": [object]`,
  each prompt's other fields from a prompts file, for rewards that take them) answers
  `{"rewards": [float]}` (one per image, in order; plus `"components"` for a multi-reward);
  a 4xx answer is the caller's fault and is not retried, a 5xx or a dropped connection is.
- `GET {url}/health` answers `{"status": "ok", "reward": SPEC, "protocol": 1}`.
- With $SPOTLIGHT_REWARD_TOKEN set on both sides, requests carry `Authorization: Bearer <token>`;
  credentials never go in the URL, which ends up in configs and logs.
- An `https://` server is checked against the system's CAs, or against `?ca_file=PATH` alone.

A batch larger than `max_images` goes as several requests, up to `concurrency` of them in flight at once (threads:
the client waits on the network, not the CPU); the rewards come back in the batch's order.

JSON only: nothing is ever unpickled. Standard library only (urllib).

Example:
    reward_fn = get_reward("http://rewards-node:8200?timeout_s=30&retries=4&max_images=16&concurrency=4")
    scores = reward_fn(images_NHW3, prompts)   # (N,) float64, one request per 16 images, 4 at a time
"""

from __future__ import annotations

import base64
import io
import json
import math
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from PIL import Image

from resources.reward_http import REWARD_TOKEN_ENV, RemoteRewardError, get_json, post_with_retries
from workers.task.reward_inputs import check_reward_batch

PROTOCOL = 1
MAX_CONCURRENCY = 64
TOKEN_ENV = REWARD_TOKEN_ENV


@dataclass(frozen=True)
class RemoteRewardConfig:
    url: str
    """http(s)://host:port[/prefix] of a `spotlight reward-serve` server."""
    timeout_s: float = 120.0
    """Seconds to wait for one request's answer (a big reward model on a big batch is slow)."""
    retries: int = 3
    """Further attempts after a failed one (connection refused or dropped, timeout, 5xx)."""
    backoff_s: float = 1.0
    """Wait before the first retry; doubles on each further retry."""
    max_images: int = 16
    """Images per request; a larger batch is split into several requests."""
    concurrency: int = 4
    """Requests of one batch in flight at once (1 = one after another)."""
    ca_file: str | None = None
    """PEM file of the CA that signed an https server's certificate, on the machines that score (read at the first
    request, not when the spec is parsed); None = the system's CAs."""

    def __post_init__(self):
        parts = urllib.parse.urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"remote reward url must be http(s)://host:port, got {self.url!r}")
        if parts.username or parts.password:
            raise ValueError(f"remote reward url must not hold credentials; set ${TOKEN_ENV} on client and server")
        if parts.query or parts.fragment:
            raise ValueError(
                "remote reward url: options go in the spec's query (timeout_s, retries, backoff_s, "
                "max_images), not in RemoteRewardConfig.url"
            )
        if not self.timeout_s > 0 or self.retries < 0 or self.backoff_s < 0 or self.max_images < 1:
            raise ValueError(
                f"remote reward: need timeout_s > 0, retries >= 0, backoff_s >= 0, max_images >= 1; got "
                f"{self.timeout_s}, {self.retries}, {self.backoff_s}, {self.max_images}"
            )
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"remote reward: concurrency must be in [1, {MAX_CONCURRENCY}], got {self.concurrency}")
        if self.ca_file is not None and parts.scheme != "https":  # the file is read where requests are made
            raise ValueError(
                f"remote reward: ca_file={self.ca_file!r} (the CA that signed the server's --tls-cert) needs an "
                "https:// url"
            )


def parse_remote_spec(spec: str) -> RemoteRewardConfig:
    """`http(s)://host:port[/prefix][?timeout_s=..&retries=..&backoff_s=..&max_images=..&concurrency=..&ca_file=..]`
    -> config."""
    parts = urllib.parse.urlsplit(spec)
    options: dict[str, object] = {}
    kinds = {
        "timeout_s": float,
        "backoff_s": float,
        "retries": int,
        "max_images": int,
        "concurrency": int,
        "ca_file": str,
    }
    for key, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        kind = kinds.get(key)
        if kind is None:
            raise ValueError(f"remote reward option {key!r}: choose from {', '.join(kinds)}")
        try:
            options[key] = kind(value)
        except ValueError:
            raise ValueError(
                f"remote reward option {key}={value!r} is not {'an integer' if kind is int else 'a number'}"
            ) from None
    url = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
    return RemoteRewardConfig(url=url, **options)


def encode_png(image_HW3: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(image_HW3).save(buf, format="PNG", compress_level=1)  # lossless; level 1: speed over size
    return base64.b64encode(buf.getvalue()).decode("ascii")


def encode_request(images_NHW3: np.ndarray, prompts: list[str], fields: list[dict] | None = None) -> bytes:
    request = {"prompts": list(prompts), "images": [encode_png(img) for img in images_NHW3]}
    if fields is not None:
        request["fields"] = list(fields)
    return json.dumps(request).encode()


def decode_rewards(body: bytes, num_images: int) -> np.ndarray:
    """The client's side: the (num_images,) rewards, or RemoteRewardError if the answer is malformed."""
    try:
        rewards = json.loads(body).get("rewards")
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
        raise RemoteRewardError(f"the reward server's answer is not a JSON object: {err}") from None
    if not isinstance(rewards, list) or len(rewards) != num_images:
        got = len(rewards) if isinstance(rewards, list) else type(rewards).__name__
        raise RemoteRewardError(f"the reward server answered {got} rewards for {num_images} images")
    if not all(isinstance(r, (int, float)) and not isinstance(r, bool) and math.isfinite(r) for r in rewards):
        raise RemoteRewardError(f"the reward server answered non-finite or non-numeric rewards: {rewards[:8]}")
    return np.asarray(rewards, dtype=np.float64)


class RemoteReward:
    """Scores through a reward server: batches of max_images per request, up to `concurrency` requests at once, each
    retried with exponential backoff."""

    def __init__(self, config: RemoteRewardConfig):
        self.config = config

    def __call__(self, images_NHW3: np.ndarray, prompts: list[str], fields: list[dict] | None = None) -> np.ndarray:
        check_reward_batch(images_NHW3, prompts)
        step = self.config.max_images
        bodies = [
            (
                encode_request(
                    images_NHW3[i : i + step], prompts[i : i + step], None if fields is None else fields[i : i + step]
                ),
                len(prompts[i : i + step]),
            )
            for i in range(0, len(prompts), step)
        ]
        if not bodies:
            return np.zeros(0)
        workers = min(self.config.concurrency, len(bodies))
        if workers == 1:
            return np.concatenate([self._post(body, n) for body, n in bodies])
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="remote-reward") as pool:
            # map keeps the batch's order and re-raises the first failed request's error (after its retries)
            return np.concatenate(list(pool.map(lambda item: self._post(*item), bodies)))

    def health(self) -> dict:
        """The server's /health answer (one attempt); RemoteRewardError if it does not answer."""
        return get_json(self.config.url + "/health", self.config.timeout_s, TOKEN_ENV, self.config.ca_file)

    def _post(self, body: bytes, num_images: int) -> np.ndarray:
        c = self.config
        answer = post_with_retries(
            c.url + "/score",
            body,
            timeout_s=c.timeout_s,
            retries=c.retries,
            backoff_s=c.backoff_s,
            token_env=TOKEN_ENV,
            ca_file=c.ca_file,
        )
        return decode_rewards(answer, num_images)


def remote_reward(arg: str) -> RemoteReward:
    """The `remote:URL` / `http://...` spec's factory; makes no request until the first call."""
    return RemoteReward(parse_remote_spec(arg))
