#!/usr/bin/env bash
# Usage: bash sky/setup.sh   (the `setup:` of sky/reserved.yaml and sky/spot_workers.yaml, run in the workdir)
#
# Builds this node's Python environment the same way on every node, and once per version of the pins:
#   - uv (UV_VERSION) installs Python PYTHON_VERSION and makes the venv SPOTLIGHT_VENV;
#   - the venv is keyed by a hash of pyproject.toml, sky/constraints.txt (the pins), the Python version, the
#     machine, the venv's path and the workdir (the venv's scripts and the editable install name both paths);
#   - path "present": this VM already holds the venv of that key (a relaunch on the same node): nothing to do;
#   - path "restore": ENV_CACHE_DIR (the run's bucket, mounted by `spotlight launch`) holds env-KEY.tar and its
#     signature env-KEY.tar.sig: the archive is copied to local disk, its signature checked against the launcher's
#     public key (SPOTLIGHT_ENV_VERIFY_KEY, base64 PEM) and only that checked copy is unpacked;
#   - path "install": `uv pip install -e . -c sky/constraints.txt`; the node holding the run's signing key (the
#     reserved node: SPOTLIGHT_ENV_SIGNING_KEY, a secret of that node alone) then tars and signs the venv into
#     ENV_CACHE_DIR once, so that every later node start and spot recovery restores it instead of reinstalling.
# Every node holds keys that can write the bucket: a spot worker never saves the cache, and nobody restores an archive
# the launcher's key did not sign (resources/cloud/env_pin.py). Without a verify key the cache is not read. A broken,
# partial, unsigned or planted cache is refused (logged) and the node installs. The path taken and the seconds spent go to the
# log ("spotlight setup: ...") and, as one JSON object, to SETUP_REPORT (default: $SPOTLIGHT_VENV.setup.json).
set -euo pipefail

started=$(date +%s.%N)
PYTHON_VERSION=${PYTHON_VERSION:-3.11}
UV_VERSION=${UV_VERSION:-0.13.8}
VENV=${SPOTLIGHT_VENV:-$HOME/.spotlight-venv}
CACHE=${ENV_CACHE_DIR:-}
REPORT=${SETUP_REPORT:-$VENV.setup.json}
VERIFY_KEY=${SPOTLIGHT_ENV_VERIFY_KEY:-}
SIGNING_KEY=${SPOTLIGHT_ENV_SIGNING_KEY:-}
SCRATCH=$(mktemp -d)   # local copies of an archive and the keys, this user's only (mktemp: 0700)
trap 'rm -rf "$SCRATCH"' EXIT

log() { echo "spotlight setup: $*"; }

ensure_uv() {
  if command -v uv >/dev/null 2>&1; then return; fi
  log "installing uv $UV_VERSION"
  curl -LsSf "https://astral.sh/uv/$UV_VERSION/install.sh" | env UV_NO_MODIFY_PATH=1 sh
  export PATH="$HOME/.local/bin:$PATH"
}

env_key() {
  { cat pyproject.toml sky/constraints.txt; echo "$PYTHON_VERSION $(uname -m) $VENV $PWD"; } | sha256sum | cut -c1-16
}

install() {
  rm -rf "$VENV"
  uv venv --python "$PYTHON_VERSION" "$VENV"
  uv pip install --python "$VENV/bin/python" -e . -c sky/constraints.txt
}

restore() {  # unpack the cached venv; false (and nothing left half-unpacked) when the archive is broken
  rm -rf "$VENV" && mkdir -p "$(dirname "$VENV")"
  if tar -xf "$1" -C "$(dirname "$VENV")"; then return 0; fi
  rm -rf "$VENV"
  return 1
}

checked_copy() {  # copy the archive and its signature to local disk and verify them there: a writer of the bucket
  # cannot swap the archive between the check and the unpacking; false when unsigned or signed by another key
  [ -n "$VERIFY_KEY" ] && [ -f "$1.sig" ] || return 1
  printf '%s' "$VERIFY_KEY" | base64 -d > "$SCRATCH/verify.pem" || return 1
  cp "$1" "$SCRATCH/env.tar" && cp "$1.sig" "$SCRATCH/env.tar.sig" || return 1
  openssl dgst -sha256 -verify "$SCRATCH/verify.pem" -signature "$SCRATCH/env.tar.sig" "$SCRATCH/env.tar" >/dev/null 2>&1
}

save() {  # tar and sign the venv locally, then copy both in under temporary names and rename: readers never see
  # half an archive (a new archive beside the old signature fails its check: that reader installs)
  local part="$1.part-$(hostname)-$$"
  (umask 077 && printf '%s' "$SIGNING_KEY" | base64 -d > "$SCRATCH/signing.key")
  if tar -cf "$SCRATCH/save.tar" -C "$(dirname "$VENV")" "$(basename "$VENV")" \
    && openssl dgst -sha256 -sign "$SCRATCH/signing.key" -out "$SCRATCH/save.tar.sig" "$SCRATCH/save.tar" \
    && cp "$SCRATCH/save.tar" "$part" && mv -f "$part" "$1" \
    && cp "$SCRATCH/save.tar.sig" "$part.sig" && mv -f "$part.sig" "$1.sig"; then
    log "saved the signed environment to $1"
  else
    rm -f "$part" "$part.sig"
    log "could not save the environment to $1 (the next node installs again)"
  fi
  rm -f "$SCRATCH/signing.key" "$SCRATCH/save.tar" "$SCRATCH/save.tar.sig"
}

ensure_uv
uv python install "$PYTHON_VERSION"
key=$(env_key)
archive=${CACHE:+$CACHE/env-$key.tar}
if [ -f "$VENV/.spotlight-env-key" ] && [ "$(cat "$VENV/.spotlight-env-key")" = "$key" ]; then
  path=present
elif [ -n "$archive" ] && [ -f "$archive" ] && checked_copy "$archive" && restore "$SCRATCH/env.tar" \
  && [ "$(cat "$VENV/.spotlight-env-key" 2>/dev/null)" = "$key" ]; then
  path=restore
else
  if [ -n "$archive" ] && [ -f "$archive" ]; then
    if [ -z "$VERIFY_KEY" ]; then
      log "no SPOTLIGHT_ENV_VERIFY_KEY: the cached environment $archive is not used: installing"
    else
      log "the cached environment $archive is unusable or not signed by this run's launcher: installing"
    fi
  fi
  install
  echo "$key" > "$VENV/.spotlight-env-key"
  path=install
  if [ -n "$archive" ] && [ -n "$SIGNING_KEY" ]; then mkdir -p "$CACHE" && save "$archive"; fi
fi
seconds=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
log "path $path (environment $key) in $seconds s; venv $VENV"
printf '{"path": "%s", "key": "%s", "seconds": %s, "venv": "%s"}\n' "$path" "$key" "$seconds" "$VENV" > "$REPORT"
