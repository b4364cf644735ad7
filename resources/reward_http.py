"""The remote reward protocol's transport: JSON over HTTP(S) to `spotlight reward-serve`, with timeouts and retries.

Network I/O and its retries live in resources/ (STYLE.md); what is sent and how the answer
is checked lives in workers/task/rewards_remote.py. A bearer token, when its environment
variable is set, goes in a header: never in a URL, an argument or a log line.
This module is also the one home of the names both sides and the cloud tasks share (REWARD_TOKEN_ENV).
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import time
import urllib.error
import urllib.request

REWARD_TOKEN_ENV = "SPOTLIGHT_REWARD_TOKEN"
"""The bearer token's environment variable: read by `spotlight reward-serve` (required off loopback) and by every
client of it; a cloud task that scores with a remote reward ships it as a secret."""


class RemoteRewardError(RuntimeError):
    """The reward server refused the request, answered nonsense, or did not answer after the retries."""


class RequestTooLarge(ValueError):
    """A scoring request over one of the server's size limits (HTTP 413): fewer or smaller images would pass."""


def client_ssl_context(ca_file: str | None) -> ssl.SSLContext | None:
    """The TLS context an https client checks the server with: the system's CAs, or only `ca_file`'s when given
    (read here, on the machine that connects: RemoteRewardError when it cannot be read there)."""
    if not ca_file:
        return None
    try:
        return ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as err:
        raise RemoteRewardError(
            f"remote reward ca_file={ca_file}: not a readable PEM CA certificate on this machine ({err})"
        ) from None


def _headers(token_env: str) -> dict[str, str]:
    token = os.environ.get(token_env)
    return {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}


def _is_tls_refusal(err: Exception) -> bool:
    """A certificate the client does not trust: the same answer every time, so not worth a retry."""
    return isinstance(getattr(err, "reason", err), ssl.SSLCertVerificationError)


def get_json(url: str, timeout_s: float, token_env: str, ca_file: str | None = None) -> dict:
    """One GET of a JSON answer; RemoteRewardError when there is none."""
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=_headers(token_env)),
            timeout=timeout_s,
            context=client_ssl_context(ca_file),
        ) as answer:
            return json.loads(answer.read())
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as err:
        raise RemoteRewardError(f"reward server {url}: {err}") from None


def post_with_retries(
    url: str,
    body: bytes,
    *,
    timeout_s: float,
    retries: int,
    backoff_s: float,
    token_env: str,
    ca_file: str | None = None,
) -> bytes:
    """POST `body`; a dropped connection, a timeout or a 5xx is retried with doubling backoff, a 4xx or an untrusted
    certificate is not (the same bytes would fail again). Returns the answer's bytes; RemoteRewardError after the
    last attempt."""
    started, last, context = time.monotonic(), None, client_ssl_context(ca_file)
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(backoff_s * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=body, headers=_headers(token_env), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s, context=context) as answer:
                return answer.read()
        except urllib.error.HTTPError as err:
            message = err.read()[:500].decode("utf-8", "replace")
            if err.code < 500:
                raise RemoteRewardError(f"reward server {url} refused the request ({err.code}): {message}") from None
            last = f"HTTP {err.code}: {message}"
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError) as err:
            if _is_tls_refusal(err):
                raise RemoteRewardError(
                    f"reward server {url}: its TLS certificate is not trusted ({getattr(err, 'reason', err)}); pass "
                    "the CA that signed it as ?ca_file=PATH in the reward spec"
                ) from None
            timed_out = isinstance(err, TimeoutError) or isinstance(getattr(err, "reason", None), TimeoutError)
            last = f"no answer within timeout_s={timeout_s:g}" if timed_out else f"{type(err).__name__}: {err}"
    raise RemoteRewardError(
        f"reward server {url} failed {retries + 1} attempts over {time.monotonic() - started:.1f} s; last error: {last}"
    )
