"""The remote reward client: spec parsing, the PNG wire format, and what a bad or absent server gets."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from resources.reward_limits import ImageLimits
from workers.task.reward_requests import decode_png, read_scoring_request
from workers.task.rewards import get_reward
from workers.task.rewards_remote import RemoteRewardError, encode_png, encode_request, parse_remote_spec

IMAGES = np.random.default_rng(0).integers(0, 256, (3, 12, 10, 3), dtype=np.uint8)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fake_server(answer):
    """A server answering every POST with answer(n_images) -> (status, bytes); yields its URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            n = len(json.loads(self.rfile.read(int(self.headers["Content-Length"])))["images"])
            status, body = answer(n)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}"


def test_png_round_trip_is_bitwise_exact():
    np.testing.assert_array_equal(decode_png(encode_png(IMAGES[0])), IMAGES[0])
    request = read_scoring_request(encode_request(IMAGES, ["a", "b", "c"]), ImageLimits(max_images=8))
    np.testing.assert_array_equal(request.images_NHW3, IMAGES)
    assert request.prompts == ["a", "b", "c"] and request.fields is None


@pytest.mark.parametrize(
    "body, message",
    [
        (b"not json", "not JSON"),
        (json.dumps({"prompts": ["a"]}).encode(), "must be"),
        (json.dumps({"prompts": ["a", "b"], "images": ["x"]}).encode(), "one prompt per image"),
        (json.dumps({"prompts": ["a"], "images": ["aGVsbG8="]}).encode(), "not a base64 PNG"),
        (
            json.dumps({"prompts": ["a", "b"], "images": [encode_png(IMAGES[0]), encode_png(IMAGES[0, :5])]}).encode(),
            "share a size",
        ),
    ],
)
def test_a_malformed_request_is_refused_with_a_reason(body, message):
    with pytest.raises(ValueError, match=message):
        read_scoring_request(body, ImageLimits(max_images=8))


def test_spec_options_parse_and_bad_ones_are_refused():
    config = parse_remote_spec("http://node:8200/?timeout_s=2.5&retries=0&max_images=4")
    assert (config.url, config.timeout_s, config.retries, config.max_images) == ("http://node:8200", 2.5, 0, 4)
    for spec, message in [
        ("ftp://node:1", "http"),
        ("http://node:1?retries=x", "not an integer"),
        ("http://node:1?max_images=0", "max_images >= 1"),
        ("http://node:1?colour=red", "choose from"),
        ("http://me:secret@node:1", "must not hold credentials"),
        ("http://node:1?ca_file=/etc/hostname", "needs an https:// url"),
    ]:
        with pytest.raises(ValueError, match=message) as err:
            get_reward(spec)
        assert "secret" not in str(err.value)


def test_a_ca_file_missing_where_requests_are_made_fails_at_the_first_request_without_retries():
    remote = get_reward("https://node:1?ca_file=/no/such/ca.pem&retries=5&backoff_s=10")  # parsed on another machine
    started = time.monotonic()
    with pytest.raises(RemoteRewardError, match="ca_file=/no/such/ca.pem: not a readable PEM CA certificate"):
        remote(IMAGES, ["a"] * 3)
    assert time.monotonic() - started < 1.0


def test_no_server_fails_clearly_after_the_retries():
    url = f"http://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    with pytest.raises(RemoteRewardError, match=f"{url}/score failed 3 attempts.*last error") as err:
        get_reward(f"remote:{url}?retries=2&backoff_s=0.05")(IMAGES, ["a"] * 3)
    assert "Connection refused" in str(err.value) or "URLError" in str(err.value)
    assert time.monotonic() - started >= 0.15  # backoff 0.05 then 0.1


def test_answers_of_the_wrong_length_or_not_finite_are_refused_without_retries():
    calls = []
    for body, message in [
        (lambda n: {"rewards": [1.0] * (n - 1)}, "answered 2 rewards for 3 images"),
        (lambda n: {"rewards": ["1"] * n}, "non-numeric"),
        (lambda n: {"rewards": [float("nan")] * n}, "non-finite"),
    ]:
        server, url = _fake_server(lambda n, body=body: (calls.append(n) or 200, json.dumps(body(n)).encode()))
        with pytest.raises(RemoteRewardError, match=message):
            get_reward(f"{url}?retries=3&backoff_s=0")(IMAGES, ["a"] * 3)
        server.shutdown()
    assert calls == [3, 3, 3]  # one request each: a wrong answer is not retried


def test_a_server_error_is_retried_then_reported():
    calls = []
    server, url = _fake_server(lambda n: (calls.append(n) or 503, b'{"error": "warming up"}'))
    with pytest.raises(RemoteRewardError, match="2 attempts.*HTTP 503.*warming up"):
        get_reward(f"{url}?retries=1&backoff_s=0")(IMAGES, ["a"] * 3)
    server.shutdown()
    assert calls == [3, 3]


def test_a_large_batch_goes_as_bounded_concurrent_requests_and_keeps_its_order():
    """6 requests of 1 image with concurrency=3: three are in flight at once, never more, and the rewards come back
    in the batch's order; each prompt's fields travel with it."""
    lock, all_in = threading.Lock(), threading.Event()
    state = {"in_flight": 0, "most": 0, "fields": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                state["in_flight"] += 1
                state["most"] = max(state["most"], state["in_flight"])
                state["fields"] += request["fields"]
                if state["in_flight"] == 3:
                    all_in.set()
            all_in.wait(timeout=2.0)  # a client that sends one at a time never gets 3 in flight: the test fails
            body = json.dumps({"rewards": [float(decode_png(i)[0, 0, 0]) for i in request["images"]]}).encode()
            with lock:
                state["in_flight"] -= 1
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        images = np.zeros((6, 4, 4, 3), dtype=np.uint8)
        images[:, 0, 0, 0] = [5, 1, 4, 2, 6, 3]
        reward = get_reward(f"http://127.0.0.1:{server.server_port}?max_images=1&concurrency=3&retries=0")
        rewards = reward(images, [f"p{i}" for i in range(6)], fields=[{"i": i} for i in range(6)])
    finally:
        server.shutdown()
    assert rewards.tolist() == [5, 1, 4, 2, 6, 3]
    assert state["most"] == 3, state
    assert sorted(f["i"] for f in state["fields"]) == list(range(6))
    with pytest.raises(ValueError, match="concurrency"):
        parse_remote_spec("http://h:1?concurrency=0")
