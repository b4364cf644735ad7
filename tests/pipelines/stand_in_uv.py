"""A stand-in for `uv` on PATH, for running sky/setup.sh here (no network): it records each call, makes a real venv
of this interpreter, and "installs" by linking this project's environment into it (a .pth file), so the venv's
python runs the project like the real one would."""

from __future__ import annotations

import json
import os
import site
import sys
from pathlib import Path
from typing import Mapping

_UV = """#!/bin/bash
printf '%s\\n' "$*" >> "$STAND_IN_UV_LOG"
case "$1" in
  python) exit 0 ;;
  venv) "$STAND_IN_PYTHON" -m venv --without-pip "${@: -1}" ;;
  pip)
    while [ "$#" -gt 0 ] && [ "$1" != --python ]; do shift; done
    purelib=$("$2" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf '%s\\n' "$STAND_IN_SITE" > "$purelib/stand-in-uv.pth" ;;
  *) echo "stand-in uv: unexpected call: $*" >&2; exit 2 ;;
esac
"""


def install_stand_in_uv(folder: Path) -> Path:
    """Write the stand-in `uv` into `folder` (put it first on PATH); returns the log of its calls."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "uv").write_text(_UV)
    (folder / "uv").chmod(0o755)
    return folder / "uv.log"


def setup_env(base: Mapping[str, str], bin_dir: Path, **envs: str) -> dict[str, str]:
    """The environment sky/setup.sh runs in with the stand-in: `bin_dir` first on PATH, this interpreter and its
    site-packages for the venvs it makes, and `envs` (SPOTLIGHT_VENV, ENV_CACHE_DIR, SETUP_REPORT, ...)."""
    env = dict(base)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        STAND_IN_UV_LOG=str(bin_dir / "uv.log"),
        STAND_IN_PYTHON=sys.executable,
        STAND_IN_SITE=os.pathsep.join(site.getsitepackages()).split(os.pathsep)[0],
        **envs,
    )
    return env


def setup_report(path: Path) -> dict:
    """What sky/setup.sh wrote: {"path": present|restore|install, "key", "seconds", "venv"}."""
    return json.loads(path.read_text())
