#!/usr/bin/env bash
# Usage: bash sky/redis_setup.sh   (the reserved node's `setup:`, after sky/setup.sh has made the venv)
#
# The node's Redis, independent of the OS image: an image's redis-server may be too old for the queue (Ubuntu 22.04
# ships 6.0.16; the queue needs >= 7.0), so this builds the release pinned in resources/queue/redis_server.py
# (PINNED_REDIS, its tarball checked against PINNED_SHA256) with TLS into REDIS_PREFIX, once per node, then checks its
# version (refusing one below MIN_REDIS with a message that says why). Only the compiler and OpenSSL's headers come
# from the image's packages.
set -euo pipefail
VENV=${SPOTLIGHT_VENV:-$HOME/.spotlight-venv}
PREFIX=${REDIS_PREFIX:-$HOME/.spotlight-redis}
if ! command -v make >/dev/null 2>&1 || ! command -v cc >/dev/null 2>&1 || [ ! -f /usr/include/openssl/ssl.h ]; then
  sudo apt-get update -q && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q build-essential pkg-config libssl-dev
fi
"$VENV/bin/python" -m resources.queue.redis_server install --prefix "$PREFIX" --cache "$HOME/.cache/spotlight-redis"
