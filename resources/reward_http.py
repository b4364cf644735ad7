"""The remote reward protocol's transport: JSON over HTTP to `spotlight reward-serve`, with timeouts and retries.

Network I/O and its retries live in resources/ (STYLE.md); what is sent and how the answer
is checked lives in workers/task/rewards_remote.py. A bearer token, when its environment
variable is set, goes in a header: never in a URL, an argument or a log line.
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request


class RemoteRewardError(RuntimeError):
    """The reward server refused the request, answered nonsense, or did not answer after the retries."""


def _headers(token_env: str) -> dict[str, str]:
    token = os.environ.get(token_env)
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}


def get_json(url: str, timeout_s: float, token_env: str) -> dict:
    """One GET of a JSON answer; RemoteRewardError when there is none."""
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=_headers(token_env)), timeout=timeout_s
        ) as answer:
            return json.loads(answer.read())
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as err:
        raise RemoteRewardError(f"reward server {url}: {err}") from None


def post_with_retries(
    url: str, body: bytes, *, timeout_s: float, retries: int, backoff_s: float, token_env: str
) -> bytes:
    """POST `body`; a dropped connection, a timeout or a 5xx is retried with doubling backoff, a 4xx is not (the
    same bytes would fail again). Returns the answer's bytes; RemoteRewardError after the last attempt."""
    started, last = time.monotonic(), None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=body, headers=_headers(token_env), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as answer:
                return answer.read()
        except urllib.error.HTTPError as err:
            message = err.read()[:500].decode("utf-8", "replace")
            if err.code < 500:
                raise RemoteRewardError(f"reward server {url} refused the request ({err.code}): {message}") from None
            last = f"HTTP {err.code}: {message}"
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as err:
            timed_out = isinstance(err, TimeoutError) or isinstance(getattr(err, "reason", None), TimeoutError)
            last = f"no answer within timeout_s={timeout_s:g}" if timed_out else f"{type(err).__name__}: {err}"
    raise RemoteRewardError(
        f"reward server {url} failed {retries + 1} attempts over {time.monotonic() - started:.1f} s; last error: {last}"
    )
