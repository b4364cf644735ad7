#!/usr/bin/env bash
# Usage: bash sky/setup.sh   (the `setup:` of sky/reserved.yaml and sky/spot_workers.yaml, run in the workdir)
#
# Builds this node's Python environment the same way on every node, and once per version of the pins:
#   - uv (UV_VERSION) installs Python PYTHON_VERSION and makes the venv SPOTLIGHT_VENV;
#   - the venv is keyed by a hash of pyproject.toml, sky/constraints.txt (the pins), the Python version, the
#     machine, the venv's path and the workdir (the venv's scripts and the editable install name both paths);
#   - path "present": this VM already holds the venv of that key (a relaunch on the same node): nothing to do;
#   - path "restore": ENV_CACHE_DIR (the run's bucket, mounted by `spotlight launch`) holds env-KEY.tar: unpacked;
#   - path "install": `uv pip install -e . -c sky/constraints.txt`, then the venv is tarred to ENV_CACHE_DIR once,
#     so that every later node start and spot recovery restores it instead of reinstalling torch and the rest.
# A broken or partial cache is ignored (logged) and the node installs. The path taken and the seconds spent go to the
# log ("spotlight setup: ...") and, as one JSON object, to SETUP_REPORT (default: $SPOTLIGHT_VENV.setup.json).
set -euo pipefail

started=$(date +%s.%N)
PYTHON_VERSION=${PYTHON_VERSION:-3.11}
UV_VERSION=${UV_VERSION:-0.13.8}
VENV=${SPOTLIGHT_VENV:-$HOME/.spotlight-venv}
CACHE=${ENV_CACHE_DIR:-}
REPORT=${SETUP_REPORT:-$VENV.setup.json}

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

save() {  # tar the venv into the cache under a temporary name, then rename: readers never see half an archive
  local part="$1.part-$(hostname)-$$"
  if tar -cf "$part" -C "$(dirname "$VENV")" "$(basename "$VENV")" && mv -f "$part" "$1"; then
    log "saved the environment to $1"
  else
    rm -f "$part"
    log "could not save the environment to $1 (the next node installs again)"
  fi
}

ensure_uv
uv python install "$PYTHON_VERSION"
key=$(env_key)
archive=${CACHE:+$CACHE/env-$key.tar}
if [ -f "$VENV/.spotlight-env-key" ] && [ "$(cat "$VENV/.spotlight-env-key")" = "$key" ]; then
  path=present
elif [ -n "$archive" ] && [ -f "$archive" ] && restore "$archive" && [ "$(cat "$VENV/.spotlight-env-key" 2>/dev/null)" = "$key" ]; then
  path=restore
else
  if [ -n "$archive" ] && [ -f "$archive" ]; then log "the cached environment $archive is unusable: installing"; fi
  install
  echo "$key" > "$VENV/.spotlight-env-key"
  path=install
  if [ -n "$archive" ]; then mkdir -p "$CACHE" && save "$archive"; fi
fi
seconds=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }')
log "path $path (environment $key) in $seconds s; venv $VENV"
printf '{"path": "%s", "key": "%s", "seconds": %s, "venv": "%s"}\n' "$path" "$key" "$seconds" "$VENV" > "$REPORT"
