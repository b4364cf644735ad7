"""The Redis the queue needs: an old redis-server is refused at setup, the pinned tarball is checked, and the test
suite's own server is the version CI promises to test."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess

import pytest


def _fake_server(tmp_path, line: str):
    script = tmp_path / "redis-server"
    script.write_text(f"#!/bin/sh\necho '{line}'\n")
    script.chmod(0o755)
    return script


def test_a_redis_older_than_the_minimum_is_refused_at_setup_saying_why(tmp_path, capsys) -> None:
    from resources.queue.redis_server import main

    old = _fake_server(tmp_path, "Redis server v=6.0.16 sha=00000000:0 malloc=jemalloc-5.2.1 bits=64 build=a3fdef44")
    assert main(["check", str(old)]) == 2
    err = capsys.readouterr().err
    assert "Redis 6.0.16 is too old" in err and "Redis >= 7.0" in err and "sky/redis_setup.sh" in err


def test_the_setup_check_passes_the_minimum_and_the_pinned_version(tmp_path, capsys) -> None:
    from resources.queue.redis_server import PINNED_REDIS, main

    for version in ("7.0.0", PINNED_REDIS):
        assert main(["check", str(_fake_server(tmp_path, f"Redis server v={version} sha=0 bits=64"))]) == 0
        assert f"Redis {version} (minimum 7.0)" in capsys.readouterr().out


def test_a_missing_or_unreadable_redis_server_is_refused(tmp_path, capsys) -> None:
    from resources.queue.redis_server import main

    assert main(["check", str(tmp_path / "nowhere")]) == 2
    assert "cannot run" in capsys.readouterr().err
    assert main(["check", str(_fake_server(tmp_path, "hello"))]) == 2
    assert "cannot read a Redis version" in capsys.readouterr().err


def test_a_tarball_that_is_not_the_pinned_one_is_refused_and_removed(tmp_path) -> None:
    from resources.queue.redis_server import RedisVersionError, verified_tarball

    tarball = tmp_path / "redis-7.2.15.tar.gz"
    tarball.write_bytes(b"not redis")
    with pytest.raises(RedisVersionError, match="not the pinned"):
        verified_tarball(tarball)
    assert not tarball.exists()
    tarball.write_bytes(b"redis")
    assert verified_tarball(tarball, hashlib.sha256(b"redis").hexdigest()) == tarball


def test_the_queue_refuses_a_server_below_the_minimum_when_it_connects(redis_server, monkeypatch) -> None:
    import resources.queue.redis_streams as streams
    from resources.queue import open_queue
    from resources.queue.base import QueueError

    real, seen = streams.check_server_version, []
    monkeypatch.setattr(streams, "check_server_version", lambda version: seen.append(version) or real("6.2.14"))
    with pytest.raises(QueueError, match="Redis 6.2.14 is too old"):
        open_queue(redis_server.url(redis_server.password))
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
    assert seen and f"v={seen[0]} " in version  # the version the server itself reported on connecting


def test_the_suites_redis_server_is_the_version_ci_tests() -> None:
    """CI (.ci/run) names the Redis it installed (SPOTLIGHT_EXPECT_REDIS, major.minor): the ACL, TLS and queue tests
    then ran against that version, the queue's minimum."""
    from resources.queue.redis_server import MIN_REDIS, check_binary

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("needs redis-server")
    found = check_binary(binary)
    assert found[:2] >= MIN_REDIS
    expected = os.environ.get("SPOTLIGHT_EXPECT_REDIS")
    if expected:
        assert ".".join(map(str, found[:2])) == expected, subprocess.run([binary, "--version"], capture_output=True)
