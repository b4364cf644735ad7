"""Stopping a child process: SIGTERM, then SIGKILL once its grace period has passed.

Example:
    stop_process(subprocess.Popen(["ssh", "-N", ...]), grace_s=5.0)
"""

from __future__ import annotations

import subprocess


def stop_process(process: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM `process`, and SIGKILL it if it has not exited within `grace_s` (a child stuck in its own shutdown,
    or a loaded machine); returns once it is gone, never with a TimeoutExpired that would hide a caller's error."""
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
