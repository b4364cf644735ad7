"""`spotlight reward-serve` and the remote client together: same scores as in process, batching, retries, timeouts."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from pipelines.reward_cli import RewardServer
from tests.paths import REPO_ROOT
from workers.task import rewards
from workers.task.rewards import get_reward, register_reward
from workers.task.rewards_remote import TOKEN_ENV, RemoteRewardError

IMAGES = np.random.default_rng(0).integers(0, 256, (7, 16, 16, 3), dtype=np.uint8)
PROMPTS = [f"prompt {i}" for i in range(7)]


@pytest.fixture
def scratch_registry(monkeypatch):
    monkeypatch.setattr(rewards, "_REGISTRY", dict(rewards._REGISTRY))
    monkeypatch.setattr(rewards, "_BUILT", {})


def _serve(reward_fn, spec="test", port=0, token=None) -> RewardServer:
    server = RewardServer(("127.0.0.1", port), reward_fn, spec, max_images=8, token=token)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _stop(server: RewardServer) -> None:
    server.shutdown()
    server.server_close()


def test_remote_scores_equal_local_scores_in_batches_of_max_images(scratch_registry):
    sizes = []
    register_reward(
        "recording", lambda images, prompts: sizes.append(len(images)) or rewards.jpeg_compressibility(images, prompts)
    )
    server = _serve(get_reward("recording"))
    remote = get_reward(f"http://127.0.0.1:{server.server_port}?max_images=3")
    np.testing.assert_array_equal(remote(IMAGES, PROMPTS), rewards.jpeg_compressibility(IMAGES, PROMPTS))
    assert sorted(sizes) == [1, 3, 3]  # sent concurrently: the server may score them in any order
    assert remote.health() == {"status": "ok", "reward": "test", "protocol": 1}
    _stop(server)


def test_a_multi_reward_served_reports_its_components(scratch_registry):
    import json
    import urllib.request

    from workers.task.rewards_remote import encode_request

    server = _serve(get_reward("multi:jpeg_compressibility=0.5"), "multi")
    body = encode_request(IMAGES[:2], PROMPTS[:2])
    with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/score", data=body, timeout=10) as answer:
        reply = json.loads(answer.read())
    np.testing.assert_allclose(
        reply["components"]["jpeg_compressibility"], rewards.jpeg_compressibility(IMAGES[:2], PROMPTS[:2])
    )
    np.testing.assert_allclose(reply["rewards"], 0.5 * np.asarray(reply["components"]["jpeg_compressibility"]))
    _stop(server)


def test_the_client_rides_out_a_server_restart(scratch_registry):
    server = _serve(rewards.jpeg_compressibility)
    port = server.server_port
    remote = get_reward(f"http://127.0.0.1:{port}?retries=6&backoff_s=0.1")
    expected = remote(IMAGES, PROMPTS)
    _stop(server)  # killed; it comes back on the same port while the client backs off
    restarted = []
    threading.Timer(0.4, lambda: restarted.append(_serve(rewards.jpeg_compressibility, port=port))).start()
    np.testing.assert_array_equal(remote(IMAGES, PROMPTS), expected)
    assert restarted
    _stop(restarted[0])


def test_a_slow_server_times_out_with_a_clear_error(scratch_registry):
    register_reward("slow", lambda images, prompts: time.sleep(2.0) or np.zeros(len(images)))
    server = _serve(get_reward("slow"))
    started = time.monotonic()
    with pytest.raises(RemoteRewardError, match="failed 2 attempts.*no answer within timeout_s=0.3"):
        get_reward(f"http://127.0.0.1:{server.server_port}?timeout_s=0.3&retries=1&backoff_s=0")(IMAGES[:1], ["a"])
    assert time.monotonic() - started < 1.9
    _stop(server)


def test_bad_requests_are_refused_at_once_with_the_servers_reason(scratch_registry):
    server = _serve(get_reward("multi:jpeg_compressibility=1,normalize=zscore"))
    with pytest.raises(RemoteRewardError, match=r"refused the request \(400\).*at least 2 images"):
        get_reward(f"http://127.0.0.1:{server.server_port}?retries=5&backoff_s=10")(IMAGES[:1], ["a"])
    _stop(server)


def test_a_token_protected_server_refuses_clients_without_it(monkeypatch, scratch_registry):
    server = _serve(rewards.jpeg_compressibility, token="s3cret")
    url = f"http://127.0.0.1:{server.server_port}?retries=0"
    with pytest.raises(RemoteRewardError, match="401") as err:
        get_reward(url)(IMAGES[:1], ["a"])
    assert "s3cret" not in str(err.value)
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    assert get_reward(url)(IMAGES[:1], ["a"]).shape == (1,)
    _stop(server)


def _start_cli_server(*args: str) -> tuple[subprocess.Popen, str]:
    """`spotlight reward-serve` in a child process and its URL, read from its first line within 60 s."""
    import queue as queue_module

    proc = subprocess.Popen(
        [sys.executable, "-m", "pipelines", "reward-serve", "--reward", "jpeg_compressibility", "--port", "0", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue_module.Queue = queue_module.Queue()
    threading.Thread(target=lambda: lines.put(proc.stdout.readline()), daemon=True).start()
    try:
        line = lines.get(timeout=60)
    except queue_module.Empty:
        line = ""
    if "on http://127.0.0.1:" not in line:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        raise AssertionError(f"the server printed no URL within 60 s: {line!r} {err[-2000:]}")
    return proc, line.split(" on ")[1].split()[0]


def _stop_cli_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def test_spotlight_reward_serve_serves_a_reward_from_the_command_line():
    proc, url = _start_cli_server()
    try:
        np.testing.assert_array_equal(get_reward(url)(IMAGES, PROMPTS), rewards.jpeg_compressibility(IMAGES, PROMPTS))
    finally:
        _stop_cli_server(proc)


def test_reward_serve_refuses_an_unknown_reward_before_listening():
    done = subprocess.run(
        [sys.executable, "-m", "pipelines", "reward-serve", "--reward", "pickscor"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "unknown reward 'pickscor'" in done.stderr and "clip" in done.stderr


def _png_of_zeros(width: int, height: int) -> bytes:
    """A valid black RGB PNG, built row by row (never the whole image in memory): small on the wire, large decoded."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer, row = zlib.compressobj(9), b"\0" * (1 + 3 * width)
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _peak_rss_mb(pid: int) -> float:
    """The process's peak resident memory so far (VmHWM), in MB."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM")) / 1024


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the server's peak memory from /proc")
def test_a_12000_by_12000_png_is_refused_from_its_header_before_it_is_decoded():
    """The server's peak memory grows by under 100 MB for a request whose one PNG would decode to 432 MB."""
    import base64
    import json
    import urllib.error
    import urllib.request

    png = _png_of_zeros(12000, 12000)
    body = json.dumps({"prompts": ["a"], "images": [base64.b64encode(png).decode()]}).encode()
    assert len(body) < 1 << 20  # under a MiB on the wire
    proc, url = _start_cli_server()
    try:
        score = get_reward(url)
        np.testing.assert_array_equal(score(IMAGES, PROMPTS), rewards.jpeg_compressibility(IMAGES, PROMPTS))
        before = _peak_rss_mb(proc.pid)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{url}/score", data=body, timeout=60)
        assert refused.value.code == 400 and "12000x12000 pixels" in refused.value.read().decode()
        assert _peak_rss_mb(proc.pid) - before < 100, f"peak memory {before:.0f} -> {_peak_rss_mb(proc.pid):.0f} MB"
        np.testing.assert_array_equal(score(IMAGES, PROMPTS), rewards.jpeg_compressibility(IMAGES, PROMPTS))
    finally:
        _stop_cli_server(proc)


def _slow_client(port: int):
    """A client that sends its headers and never its body."""
    import socket

    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /score HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
    return sock


def _answer(sock, timeout_s: float) -> bytes:
    """What the server sends before it closes the connection (b"" if it just closed it), within `timeout_s`."""
    sock.settimeout(timeout_s)
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


def test_forty_slow_clients_are_dropped_after_the_timeout_while_a_normal_request_succeeds(scratch_registry):
    timeout_s = 3.0
    server = RewardServer(("127.0.0.1", 0), rewards.jpeg_compressibility, "test", max_images=8, timeout_s=timeout_s)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    slow = [_slow_client(server.server_port) for _ in range(40)]
    try:
        started = time.monotonic()
        scores = get_reward(f"http://127.0.0.1:{server.server_port}?retries=0")(IMAGES, PROMPTS)
        served_after_s = time.monotonic() - started
        np.testing.assert_array_equal(scores, rewards.jpeg_compressibility(IMAGES, PROMPTS))
        answers = [_answer(sock, timeout_s + 15) for sock in slow]
        dropped_after_s = time.monotonic() - started
    finally:
        for sock in slow:
            sock.close()
        _stop(server)
    assert served_after_s < timeout_s, "the normal request waited for the slow clients"
    assert all(a.startswith(b"HTTP/1.0 408") for a in answers), answers[:2]
    assert timeout_s <= dropped_after_s < timeout_s + 15


def test_connections_over_the_limit_get_a_503_at_once_and_a_slot_frees_when_one_is_dropped(scratch_registry):
    server = RewardServer(("127.0.0.1", 0), rewards.jpeg_compressibility, "test", timeout_s=2.0, max_connections=3)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    slow = [_slow_client(server.server_port) for _ in range(3)]
    try:
        over = _slow_client(server.server_port)
        assert _answer(over, 10).startswith(b"HTTP/1.0 503"), "a fourth connection must be refused, not queued"
        over.close()
        assert all(_answer(sock, 15).startswith(b"HTTP/1.0 408") for sock in slow)
        url = f"http://127.0.0.1:{server.server_port}?retries=3&backoff_s=0.2"
        assert get_reward(url)(IMAGES[:1], ["a"]).shape == (1,)  # the slots are free again
    finally:
        for sock in slow:
            sock.close()
        _stop(server)


def test_a_server_off_loopback_refuses_to_start_without_a_token(monkeypatch):
    from typer.testing import CliRunner

    from pipelines.cli import app

    with pytest.raises(ValueError, match=f"needs a token: set \\${TOKEN_ENV}"):
        RewardServer(("0.0.0.0", 0), rewards.jpeg_compressibility, "test")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    result = CliRunner().invoke(
        app, ["reward-serve", "--reward", "jpeg_compressibility", "--host", "0.0.0.0"], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 2 and "needs a token" in result.output
    guarded = RewardServer(("0.0.0.0", 0), rewards.jpeg_compressibility, "test", token="s3cret")
    guarded.server_close()
