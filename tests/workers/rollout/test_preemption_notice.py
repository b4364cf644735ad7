"""Cloud preemption notices, against a local fake metadata server that speaks AWS IMDSv2 and GCP."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from typing import Iterator

import pytest

from resources.queue import open_queue
from tests.paths import REPO_ROOT
from tests.procs import ProcessLines
from workers.algo.sampler import SamplerConfig
from workers.rollout.preemption_notice import NoticeWatcher, notice_checker
from workers.rollout.state import RolloutSpec, rollout_request

REPO = REPO_ROOT


class FakeMetadata(http.server.ThreadingHTTPServer):
    """Answers like a VM's metadata server; `preempted` flips the answer to a notice."""

    preempted = False
    token = "fake-imds-token"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: FakeMetadata

    def log_message(self, *args) -> None:  # keep test output quiet
        return None

    def do_PUT(self) -> None:  # IMDSv2 session token
        ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
        self._answer(200 if ok else 400, self.server.token if ok else "")

    def do_GET(self) -> None:
        if self.path == "/latest/meta-data/spot/instance-action":
            if self.headers.get("X-aws-ec2-metadata-token") != self.server.token:
                return self._answer(401, "")
            if not self.server.preempted:
                return self._answer(404, "Not Found")
            return self._answer(200, json.dumps({"action": "terminate", "time": "2026-11-30T12:00:00Z"}))
        if self.path == "/computeMetadata/v1/instance/preempted":
            if self.headers.get("Metadata-Flavor") != "Google":
                return self._answer(403, "")
            return self._answer(200, "TRUE" if self.server.preempted else "FALSE")
        self._answer(404, "")

    def _answer(self, code: int, body: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def metadata() -> Iterator[FakeMetadata]:
    server = FakeMetadata(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server: FakeMetadata, cloud: str) -> str:
    path = "/latest/meta-data/spot/instance-action" if cloud == "aws" else "/computeMetadata/v1/instance/preempted"
    return f"http://127.0.0.1:{server.server_address[1]}{path}"


@pytest.mark.parametrize("cloud", ["aws", "gcp"])
def test_a_notice_is_seen_only_once_the_cloud_announces_it(metadata, cloud) -> None:
    check = notice_checker(cloud, _url(metadata, cloud))
    assert check() is False
    metadata.preempted = True
    assert check() is True


def test_an_unreachable_metadata_server_is_not_a_notice() -> None:
    assert notice_checker("aws", "http://127.0.0.1:1/latest/meta-data/spot/instance-action", timeout_s=0.5)() is False


def test_notices_are_off_by_default_and_bad_sources_are_refused() -> None:
    assert notice_checker("off") is None
    with pytest.raises(ValueError, match="one of"):
        notice_checker("azure")
    with pytest.raises(ValueError, match="http"):
        notice_checker("gcp", "file:///etc/passwd")


def test_the_watcher_calls_back_once_when_the_notice_arrives(metadata) -> None:
    fired = []
    checks = threading.Semaphore(0)
    check = notice_checker("gcp", _url(metadata, "gcp"))

    def counted() -> bool:
        answer = check()
        checks.release()
        return answer

    watcher = NoticeWatcher(counted, lambda: fired.append(1), interval_s=0.05).start()
    for _ in range(3):  # three real "no notice" answers, however slow the machine
        assert checks.acquire(timeout=30), "the watcher stopped checking"
    assert not fired and not watcher.noticed.is_set()
    metadata.preempted = True
    assert watcher.noticed.wait(30)
    watcher.stop()
    assert fired == [1]


def test_a_worker_on_a_preempted_aws_vm_commits_its_state_and_exits_cleanly(tmp_path, rollout_store, metadata) -> None:
    spec = RolloutSpec("demo", "a red circle", 5, 0, SamplerConfig(num_steps=8))
    queue = open_queue(tmp_path / "queue.db")
    queue.put([rollout_request("r0", 0, spec)])
    command = [
        sys.executable,
        "-m",
        "workers.rollout",
        "--queue",
        str(tmp_path / "queue.db"),
        "--store",
        str(rollout_store.root),
        "--commit-every",
        "100",
        "--step-delay-s",
        "0.3",
        "--preemption-notice",
        "aws",
        "--notice-url",
        _url(metadata, "aws"),
        "--notice-interval-s",
        "0.1",
        "--threads",
        "1",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with ProcessLines(
        subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    ) as worker:
        worker.wait_for_json(lambda e: e["event"] == "step", timeout_s=120, what="the first step")
        metadata.preempted = True
        rest, err = worker.finish(timeout_s=60)
    assert worker.proc.returncode == 0, err
    events = [json.loads(line) for line in rest]
    assert [e["event"] for e in events if e["event"] in ("notice", "preempted", "exit")] == [
        "notice",
        "preempted",
        "exit",
    ]
    preempted = next(e for e in events if e["event"] == "preempted")
    assert preempted["committed_step"] == preempted["step"] >= 1
    assert queue.states(["r0"]) == {"r0": "pending"}  # given back for another worker


@pytest.mark.parametrize(
    "info,cloud",
    [
        ('{"cloud": "AWS", "region": "us-east-1"}', "aws"),
        ('{"cloud": "GCP"}', "gcp"),
        ('{"cloud": "Azure"}', "off"),
        (None, "off"),
        ("not json", "off"),
    ],
)
def test_auto_follows_the_cloud_skypilot_launched_the_vm_on(info, cloud) -> None:
    from workers.rollout.preemption_notice import skypilot_cloud

    assert skypilot_cloud(info) == cloud


def test_the_instance_label_defaults_to_skypilots_cloud_and_region() -> None:
    from workers.rollout.worker import default_instance_type

    assert default_instance_type('{"cloud": "GCP", "region": "us-central1"}') == "sky-gcp-us-central1"
    assert default_instance_type(None) == "local-cpu"
