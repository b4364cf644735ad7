"""Cloud preemption notices: poll the VM's metadata server and treat a notice like SIGTERM.

SkyPilot forwards no preemption notice to the job, so a rollout worker on a spot VM
asks the cloud itself:

- AWS: `GET /latest/meta-data/spot/instance-action` answers 404 until the instance is
  scheduled for interruption (about 2 minutes ahead), then a JSON body such as
  `{"action": "terminate", "time": "..."}`. IMDSv2 needs a session token from
  `PUT /latest/api/token` first; the checker falls back to IMDSv1 if the PUT fails.
- GCP: `GET /computeMetadata/v1/instance/preempted` with `Metadata-Flavor: Google`
  answers `TRUE` once the VM is being preempted (about 30 s ahead).

Off by default (a laptop has no metadata server); `auto` picks the cloud SkyPilot
launched the VM on (from `SKYPILOT_CLUSTER_INFO`), and the URL is injectable so tests
run the same code against a local fake server.

Example:
    check = notice_checker("aws")                       # or ("gcp"), or ("aws", url="http://127.0.0.1:8000/...")
    watcher = NoticeWatcher(check, on_notice=stop.set, interval_s=5).start()
"""

from __future__ import annotations

import json
import os
import threading
import urllib.error
import urllib.request
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

CLOUDS = ("off", "auto", "aws", "gcp")
AWS_ACTION_URL = "http://169.254.169.254/latest/meta-data/spot/instance-action"
GCP_PREEMPTED_URL = "http://metadata.google.internal/computeMetadata/v1/instance/preempted"
_AWS_ACTIONS = ("terminate", "stop", "hibernate")


def notice_checker(cloud: str, url: str | None = None, timeout_s: float = 2.0) -> Callable[[], bool] | None:
    """A function that returns True once the cloud announced this VM's preemption (None for 'off')."""
    if cloud not in CLOUDS:
        raise ValueError(f"preemption notice source must be one of {CLOUDS}, got {cloud!r}")
    if cloud == "auto":
        cloud = skypilot_cloud(os.environ.get("SKYPILOT_CLUSTER_INFO"))
    if cloud == "off":
        if url is not None:
            raise ValueError("a notice URL needs --preemption-notice aws or gcp")
        return None
    if url is not None and urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"notice URL must be http(s)://..., got {url!r}")
    if cloud == "aws":
        return lambda: aws_notice(url or AWS_ACTION_URL, timeout_s)
    return lambda: gcp_notice(url or GCP_PREEMPTED_URL, timeout_s)


def skypilot_cloud(cluster_info: str | None) -> str:
    """'aws' or 'gcp' from SkyPilot's SKYPILOT_CLUSTER_INFO JSON; 'off' elsewhere (or when absent)."""
    try:
        cloud = str(json.loads(cluster_info or "{}").get("cloud", "")).lower()
    except (ValueError, AttributeError):
        return "off"
    return cloud if cloud in ("aws", "gcp") else "off"


def aws_notice(action_url: str, timeout_s: float) -> bool:
    """True when the instance-action document names an interruption; False on 404."""
    parts = urlsplit(action_url)
    token_url = urlunsplit((parts.scheme, parts.netloc, "/latest/api/token", "", ""))
    headers = {}
    token = _http(token_url, timeout_s, method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"})
    if token is not None:
        headers["X-aws-ec2-metadata-token"] = token
    body = _http(action_url, timeout_s, headers=headers)
    if body is None:
        return False
    try:
        action = json.loads(body).get("action")
    except (ValueError, AttributeError):
        return False
    return action in _AWS_ACTIONS


def gcp_notice(preempted_url: str, timeout_s: float) -> bool:
    """True when GCP's metadata says the VM is being preempted."""
    body = _http(preempted_url, timeout_s, headers={"Metadata-Flavor": "Google"})
    return body is not None and body.strip().upper() == "TRUE"


def _http(url: str, timeout_s: float, method: str = "GET", headers: dict | None = None) -> str | None:
    """Body of a 2xx answer, or None for any HTTP error or unreachable server (no notice)."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read(64 * 1024).decode("utf-8", "replace")
    except (urllib.error.URLError, OSError, ValueError):
        return None


class NoticeWatcher:
    """Polls `check` every `interval_s` in a daemon thread; calls `on_notice` once when it turns True."""

    def __init__(self, check: Callable[[], bool], on_notice: Callable[[], None], interval_s: float = 5.0) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.check, self.on_notice, self.interval_s = check, on_notice, interval_s
        self.noticed = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="preemption-notice", daemon=True)

    def start(self) -> "NoticeWatcher":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5)

    def _poll(self) -> None:
        while not self._stop.is_set():
            if self.check():
                self.noticed.set()
                self.on_notice()
                return
            self._stop.wait(self.interval_s)
