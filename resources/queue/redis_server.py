"""The Redis server the queue needs: the minimum version, and the pinned release the reserved node builds.

The queue's ACL (selectors, `-function`) and its Functions library need Redis 7.0; an OS image's package may be
older (Ubuntu 22.04, SkyPilot's AWS GPU images, ships 6.0.16). So the reserved node does not take the image's
Redis: its setup builds PINNED_REDIS from Redis's own release tarball, checked against PINNED_SHA256 (the value
published in github.com/redis/redis-hashes), with TLS, into a folder of its own; then it checks the binary's
`--version` and refuses anything below MIN_REDIS before the run starts. No PyPI package ships a Redis >= 7 built
with TLS (docs/SPOT_RUNTIME.md, "The node's Redis"), hence the build.

Example:
    python -m resources.queue.redis_server install --prefix ~/.spotlight-redis    # the node's setup
    python -m resources.queue.redis_server check ~/.spotlight-redis/bin/redis-server
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from resources.queue.base import QueueError

MIN_REDIS = (7, 0)
"""The oldest Redis the queue runs on: Functions (FCALL), ACL selectors and the `-function` rule came in 7.0."""
PINNED_REDIS = "7.2.15"
"""The Redis the reserved node builds (the 7.2 line: maintained, BSD-licensed)."""
PINNED_SHA256 = "7bf7975331511fdb788e85dae63964b128fccee1df026a10db57444babc9c9c4"
"""sha256 of redis-PINNED_REDIS.tar.gz, as github.com/redis/redis-hashes publishes it."""
RELEASE_URL = "https://download.redis.io/releases/redis-{version}.tar.gz"


class RedisVersionError(QueueError):
    """A redis-server that is missing, unreadable or older than MIN_REDIS."""


def parse_version(text: str) -> tuple[int, ...]:
    """(7, 2, 15) from `redis-server --version`'s line ('Redis server v=7.2.15 sha=...') or a bare '7.2.15'."""
    found = re.search(r"(?:v=|^)(\d+)\.(\d+)(?:\.(\d+))?", text.strip())
    if found is None:
        raise RedisVersionError(f"cannot read a Redis version from {text.strip()[:80]!r}")
    return tuple(int(part) for part in found.groups() if part is not None)


def check_server_version(version: str) -> tuple[int, ...]:
    """The version as a tuple; RedisVersionError naming it and the minimum when it is below MIN_REDIS."""
    found = parse_version(version)
    if found[:2] < MIN_REDIS:
        minimum = ".".join(map(str, MIN_REDIS))
        raise RedisVersionError(
            f"Redis {'.'.join(map(str, found))} is too old: the queue needs Redis >= {minimum} (Functions, ACL "
            f"selectors). On the reserved node, sky/redis_setup.sh builds Redis {PINNED_REDIS}; locally, install "
            f"Redis >= {minimum} (Debian 12's redis-server is 7.0.15) or run without --queue redis://"
        )
    return found


def check_binary(binary: str | Path) -> tuple[int, ...]:
    """Run `binary --version` and check it (check_server_version); RedisVersionError when it does not run."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError as err:
        raise RedisVersionError(f"cannot run {binary} --version: {err.strerror}") from None
    if done.returncode != 0:
        raise RedisVersionError(f"{binary} --version exited with {done.returncode}: {done.stderr.strip()[:200]}")
    return check_server_version(done.stdout)


def verified_tarball(path: Path, sha256: str = PINNED_SHA256) -> Path:
    """`path` when its sha256 is `sha256`; RedisVersionError (and the file removed) otherwise."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        path.unlink()
        raise RedisVersionError(
            f"{path.name} has sha256 {digest}, not the pinned {sha256}: a changed or corrupt download, refused"
        )
    return path


def install(prefix: Path, cache: Path | None = None, jobs: int | None = None) -> Path:
    """Build PINNED_REDIS with TLS into `prefix` (bin/redis-server), unless it is there already; the binary."""
    binary = prefix / "bin" / "redis-server"
    if binary.is_file() and parse_version(_version_line(binary)) == parse_version(PINNED_REDIS):
        return binary
    with tempfile.TemporaryDirectory() as work:
        tarball = (cache or Path(work)) / f"redis-{PINNED_REDIS}.tar.gz"
        if not tarball.is_file():
            tarball.parent.mkdir(parents=True, exist_ok=True)
            urllib.request.urlretrieve(RELEASE_URL.format(version=PINNED_REDIS), tarball)  # noqa: S310 (fixed https URL)
        verified_tarball(tarball)
        with tarfile.open(tarball) as archive:
            archive.extractall(work, filter="data")
        source = Path(work) / f"redis-{PINNED_REDIS}"
        make = ["make", f"-j{jobs or os.cpu_count() or 2}", "BUILD_TLS=yes", f"PREFIX={prefix}"]
        subprocess.run([*make, "install"], cwd=source, check=True, stdout=subprocess.DEVNULL)
    return binary


def _version_line(binary: Path) -> str:
    return subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30).stdout


def main(argv: list[str] | None = None) -> int:
    """Build the pinned Redis (install) or check a redis-server's version (check); exit 2 saying why not."""
    parser = argparse.ArgumentParser(prog="python -m resources.queue.redis_server", description=main.__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("install", help=f"build Redis {PINNED_REDIS} (TLS) into --prefix, then check it")
    build.add_argument("--prefix", type=Path, required=True, help="where bin/redis-server goes")
    build.add_argument("--cache", type=Path, help="a folder that keeps the downloaded tarball")
    check = sub.add_parser("check", help=f"refuse a redis-server older than {'.'.join(map(str, MIN_REDIS))}")
    check.add_argument("binary", nargs="?", default="redis-server", help="the redis-server to check")
    args = parser.parse_args(argv)
    try:
        binary = install(args.prefix, args.cache) if args.command == "install" else args.binary
        version = check_binary(binary)
    except (RedisVersionError, subprocess.CalledProcessError, OSError) as err:
        print(f"resources.queue.redis_server: {err}", file=sys.stderr)
        return 2
    print(f"{binary}: Redis {'.'.join(map(str, version))} (minimum {'.'.join(map(str, MIN_REDIS))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
