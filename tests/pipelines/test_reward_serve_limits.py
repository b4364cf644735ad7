"""reward-serve under hostile clients, on a real socket with real HTTP clients: trickling clients cut at the
deadline, a connection cap, size and pixel limits refused before decoding, and TLS."""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
from PIL import ImageFile

from pipelines.reward_cli import reward_server
from resources.reward_limits import ServeLimits
from resources.reward_server import server_ssl_context
from tests.pipelines.reward_clients import Trickle, make_test_ca, png_of_zeros, recording_loads, serving, start_all
from tests.pipelines.test_reward_serve import start_cli_server, stop_cli_server
from workers.task import rewards
from workers.task.rewards import get_reward
from workers.task.rewards_remote import TOKEN_ENV, RemoteRewardError, encode_request

IMAGES = np.random.default_rng(0).integers(0, 256, (7, 16, 16, 3), dtype=np.uint8)
PROMPTS = [f"prompt {i}" for i in range(7)]
EXPECTED = rewards.jpeg_compressibility(IMAGES, PROMPTS)
TOKEN = "t0ken-for-tests"
BODY = encode_request(IMAGES[:1], ["a"])


def _server(token: str | None = TOKEN, **limits):
    return reward_server(("127.0.0.1", 0), rewards.jpeg_compressibility, "test", ServeLimits(**limits), token=token)


def _head(length: int, token: str | None = TOKEN) -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = f"POST /score HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\n"
    return f"{head}Content-Length: {length}\r\n\r\n".encode()


def _honest(url: str, took_s: list[float], answers: list) -> None:
    started = time.monotonic()
    answers.append(get_reward(url)(IMAGES, PROMPTS))
    took_s.append(time.monotonic() - started)


def test_trickling_clients_are_cut_at_the_deadline_while_honest_requests_are_answered_at_once(monkeypatch):
    """Slow headers are cut at header_timeout_s (before the token is read); a slow body, token and all, at the whole
    request's deadline, however steadily its bytes arrive."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    server = _server(deadline_s=2.0, header_timeout_s=1.0, max_connections=16)
    with serving(server):
        port = server.server_port
        slow_heads = [Trickle(port, b"", _head(len(BODY))) for _ in range(3)]
        slow_bodies = [Trickle(port, _head(len(BODY)), BODY) for _ in range(3)]
        threads = start_all(slow_heads + slow_bodies)
        time.sleep(0.3)  # the trickles are connected and sending
        took_s: list[float] = []
        answers: list = []
        url = f"http://127.0.0.1:{port}?retries=0"
        honest = [threading.Thread(target=_honest, args=(url, took_s, answers)) for _ in range(4)]
        for thread in honest:
            thread.start()
        for thread in honest + threads:
            thread.join(20)
    assert len(answers) == 4 and all(np.array_equal(a, EXPECTED) for a in answers)
    assert max(took_s) < 5.0, took_s
    for client in slow_heads:
        assert client.received.startswith(b"HTTP/1.1 408") and b"headers did not arrive within 1 s" in client.received
        assert client.closed_after_s is not None and 1.0 <= client.closed_after_s < 2.5, client.closed_after_s
    for client in slow_bodies:
        assert client.received.startswith(b"HTTP/1.1 408") and b"deadline of 2 s" in client.received
        assert client.closed_after_s is not None and 2.0 <= client.closed_after_s < 2.75, client.closed_after_s


def test_two_tricklers_holding_both_slots_are_cut_and_a_waiting_client_is_served(monkeypatch):
    """Two trickling clients fill a server with two slots and a 2 s deadline (they held http.server's slots as long as
    they liked). A third connection gets a 503 at once; once the two are cut at the deadline, a retrying client is
    served, all within 5 s."""
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    server = _server(deadline_s=2.0, max_connections=2)
    with serving(server):
        port = server.server_port
        tricklers = [Trickle(port, _head(len(BODY)), BODY, every_s=0.5) for _ in range(2)]
        threads = start_all(tricklers)
        time.sleep(0.3)
        over = Trickle(port, _head(len(BODY)), BODY)
        over.run(give_up_s=3)
        assert over.received.startswith(b"HTTP/1.1 503") and over.closed_after_s < 1.0
        started = time.monotonic()
        scores = get_reward(f"http://127.0.0.1:{port}?retries=8&backoff_s=0.1")(IMAGES, PROMPTS)
        served_after_s = time.monotonic() - started
        for thread in threads:
            thread.join(10)
    np.testing.assert_array_equal(scores, EXPECTED)
    assert served_after_s < 5.0
    assert all(t.received.startswith(b"HTTP/1.1 408") and 2.0 <= t.closed_after_s < 2.75 for t in tricklers)


def _post(url: str, body: bytes, token: str | None = TOKEN) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers), timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_a_batch_over_the_pixel_budget_is_refused_from_its_headers_without_decoding(monkeypatch):
    """256 PNGs of 4096x4096 (17 MB on the wire, 12 GiB decoded), each under the per-image limit: refused (413) from
    their headers; PIL's decoder (ImageFile.load) is never entered for them, and is for an ordinary request."""
    loads: list[int] = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", recording_loads(real_load, loads))
    png = base64.b64encode(png_of_zeros(4096, 4096)).decode()
    body = json.dumps({"prompts": ["a"] * 256, "images": [png] * 256}).encode()
    server = _server(token=None)
    with serving(server):
        url = f"http://127.0.0.1:{server.server_port}/score"
        started = time.monotonic()
        status, answer = _post(url, body, token=None)
        refused_after_s = time.monotonic() - started
        assert loads == []
        assert _post(url, encode_request(IMAGES, PROMPTS), token=None)[0] == 200
    assert status == 413 and "256 images hold 4294967296 pixels" in answer and "?max_images=4" in answer, answer
    assert refused_after_s < 3.0
    assert loads == [16] * 7  # the ordinary request: each of its 7 images decoded once


def test_a_body_over_the_size_limit_is_refused_from_content_length_and_while_streaming():
    server = _server(token=None, max_request_bytes=100_000)
    with serving(server):
        declared = Trickle(server.server_port, _head(10**9, token=None), b"x" * 10)
        declared.run(give_up_s=5)
        head = b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        chunk = b"%x\r\n%s\r\n" % (50_000, b"x" * 50_000)
        streamed = Trickle(server.server_port, head + chunk * 3, b"0\r\n\r\n")
        streamed.run(give_up_s=5)
    assert declared.received.startswith(b"HTTP/1.1 413") and b"1000000000 bytes" in declared.received
    assert streamed.received.startswith(b"HTTP/1.1 413") and b"more than 100000 bytes" in streamed.received


def test_a_wrong_token_gets_a_401_before_its_body_is_read():
    server = _server(max_request_bytes=100)
    with serving(server):
        url = f"http://127.0.0.1:{server.server_port}"
        assert _post(url + "/score", b"{}" * 1000, token="wrong")[0] == 401  # over the size limit, but 401 first
        assert _post(url + "/score", b"{}", token=None)[0] == 401
        with pytest.raises(RemoteRewardError, match="401"):
            get_reward(f"{url}?retries=0").health()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's peak memory from /proc")
def test_a_12000_by_12000_png_is_refused_from_its_header_before_it_is_decoded():
    """The server's peak memory grows by under 100 MB for a request whose one PNG would decode to 432 MB."""
    png = png_of_zeros(12000, 12000)
    body = json.dumps({"prompts": ["a"], "images": [base64.b64encode(png).decode()]}).encode()
    assert len(body) < 1 << 20  # under a MiB on the wire
    proc, url = start_cli_server()
    try:
        score = get_reward(url)
        np.testing.assert_array_equal(score(IMAGES, PROMPTS), EXPECTED)
        before = _peak_rss_mb(proc.pid)
        status, answer = _post(f"{url}/score", body, token=None)
        assert status == 413 and "12000x12000 pixels" in answer
        assert _peak_rss_mb(proc.pid) - before < 100, f"peak memory {before:.0f} -> {_peak_rss_mb(proc.pid):.0f} MB"
        np.testing.assert_array_equal(score(IMAGES, PROMPTS), EXPECTED)
    finally:
        stop_cli_server(proc)


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024


def test_https_with_the_runs_ca_scores_and_an_untrusted_certificate_is_refused_without_retries(tmp_path, monkeypatch):
    ca, cert, key = make_test_ca(tmp_path)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    tls = server_ssl_context(str(cert), str(key))
    limits = ServeLimits(header_timeout_s=0.5)
    server = reward_server(("127.0.0.1", 0), rewards.jpeg_compressibility, "test", limits, token=TOKEN, ssl_context=tls)
    with serving(server):
        url = f"https://127.0.0.1:{server.server_port}"
        silent = Trickle(server.server_port, b"", b"", every_s=0.1)  # connects, never starts the TLS handshake
        silent.run(give_up_s=5)
        assert silent.closed_after_s is not None and 0.5 <= silent.closed_after_s < 1.5, silent.closed_after_s
        np.testing.assert_array_equal(get_reward(f"{url}?ca_file={ca}")(IMAGES, PROMPTS), EXPECTED)
        started = time.monotonic()
        with pytest.raises(RemoteRewardError, match="TLS certificate is not trusted.*ca_file"):
            get_reward(f"{url}?retries=5&backoff_s=1")(IMAGES, PROMPTS)
        assert time.monotonic() - started < 1.0  # not retried
        plain = Trickle(server.server_port, _head(len(BODY)), BODY, every_s=0.05)
        plain.run(give_up_s=5)
        assert not plain.received.startswith(b"HTTP/1.1 200")  # plain HTTP on the TLS port is not served
    key.chmod(0o644)
    with pytest.raises(ValueError, match="readable by every user: `chmod 600"):
        server_ssl_context(str(cert), str(key))


class _Counting:
    """A decode or score step that takes `busy_s` and notes the most calls it saw running at once."""

    def __init__(self, busy_s: float, result=None):
        self.busy_s, self.result, self.now, self.most = busy_s, result, 0, 0
        self.lock = threading.Lock()

    def __call__(self, *args):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
        time.sleep(self.busy_s)
        with self.lock:
            self.now -= 1
        return self.result


def test_decoding_runs_at_most_decode_concurrency_at_once_and_scoring_one_at_a_time():
    from resources.reward_server import RewardServer

    decode, score = _Counting(0.3, "batch"), _Counting(0.05, {"rewards": [1.0]})
    server = RewardServer(("127.0.0.1", 0), decode, score, {}, ServeLimits(decode_concurrency=2))
    with serving(server):
        url = f"http://127.0.0.1:{server.server_port}/score"
        answers: list = []
        posts = [threading.Thread(target=lambda: answers.append(_post(url, b"{}", token=None))) for _ in range(6)]
        for thread in posts:
            thread.start()
        for thread in posts:
            thread.join(20)
    assert answers == [(200, '{"rewards": [1.0]}')] * 6
    assert (decode.most, score.most) == (2, 1)


def test_a_request_the_server_cannot_finish_by_its_deadline_gets_a_503_at_the_deadline():
    from resources.reward_server import RewardServer

    server = RewardServer(
        ("127.0.0.1", 0), lambda body, deadline: "batch", _Counting(1.5), {}, ServeLimits(deadline_s=1.0)
    )
    with serving(server):
        started = time.monotonic()
        status, answer = _post(f"http://127.0.0.1:{server.server_port}/score", b"{}", token=None)
        answered_after_s = time.monotonic() - started
    assert status == 503 and "still being scored at the server's deadline of 1 s" in answer
    assert 1.0 <= answered_after_s < 1.4


def test_reward_serve_refuses_half_a_tls_pair_or_a_key_every_user_can_read(tmp_path):
    from typer.testing import CliRunner

    from pipelines.cli import app

    _, cert, key = make_test_ca(tmp_path)
    serve = ["reward-serve", "--reward", "jpeg_compressibility", "--port", "0"]
    half = CliRunner().invoke(app, [*serve, "--tls-cert", str(cert)], env={"COLUMNS": "300"})
    assert half.exit_code == 2 and "--tls-cert and --tls-key go together" in half.output
    key.chmod(0o604)
    open_key = CliRunner().invoke(app, [*serve, "--tls-cert", str(cert), "--tls-key", str(key)], env={"COLUMNS": "300"})
    assert open_key.exit_code == 2 and "readable by every user" in open_key.output
