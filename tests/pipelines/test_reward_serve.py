"""`spotlight reward-serve` and the remote client together: same scores as in process, batching, retries, timeouts,
the token. Hostile clients, size limits and TLS: test_reward_serve_limits.py."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from pipelines.reward_cli import reward_server
from resources.reward_server import RewardServer
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
    from resources.reward_limits import ImageLimits

    server = reward_server(("127.0.0.1", port), reward_fn, spec, image_limits=ImageLimits(max_images=8), token=token)
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


def start_cli_server(*args: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`spotlight reward-serve` in a child process and its URL, read from its first line within 60 s."""
    import os
    import queue as queue_module

    proc = subprocess.Popen(
        [sys.executable, "-m", "pipelines", "reward-serve", "--reward", "jpeg_compressibility", "--port", "0", *args],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
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


def stop_cli_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def test_spotlight_reward_serve_serves_a_reward_from_the_command_line_and_never_prints_its_token(monkeypatch):
    token = "tok-" + "Zq7" * 8
    proc, url = start_cli_server(env={TOKEN_ENV: token})
    try:
        monkeypatch.setenv(TOKEN_ENV, token[:-1] + "x")  # same length, last character wrong
        with pytest.raises(RemoteRewardError, match="401"):
            get_reward(f"{url}?retries=0")(IMAGES, PROMPTS)
        monkeypatch.setenv(TOKEN_ENV, token)
        np.testing.assert_array_equal(get_reward(url)(IMAGES, PROMPTS), rewards.jpeg_compressibility(IMAGES, PROMPTS))
        with open(f"/proc/{proc.pid}/cmdline", "rb") as cmdline:
            assert token.encode() not in cmdline.read()
    finally:
        stop_cli_server(proc)
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err[-2000:]  # SIGTERM ends it cleanly
    assert token not in out + err and token[:-1] not in out + err


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


def test_a_server_off_loopback_refuses_to_start_without_a_token(monkeypatch):
    from typer.testing import CliRunner

    from pipelines.cli import app

    with pytest.raises(ValueError, match=f"needs a token: set \\${TOKEN_ENV}"):
        reward_server(("0.0.0.0", 0), rewards.jpeg_compressibility, "test")
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    for host in ("0.0.0.0", "10.1.2.3", "reward-node"):
        result = CliRunner().invoke(
            app, ["reward-serve", "--reward", "jpeg_compressibility", "--host", host], env={"COLUMNS": "300"}
        )
        assert result.exit_code == 2 and "needs a token" in result.output, (host, result.output)
    guarded = reward_server(("0.0.0.0", 0), rewards.jpeg_compressibility, "test", token="s3cret")
    guarded.server_close()
