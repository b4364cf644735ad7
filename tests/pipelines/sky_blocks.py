"""Run a SkyPilot task's `run:` block on this machine the way SkyPilot runs it on a node (for the rehearsal test).

SkyPilot writes the run section to a script and runs it with bash in the synced workdir,
with the task's envs and its secrets as environment variables; it runs no setup here (this
machine is already set up). A managed job's recovery runs the same block again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping


@dataclass
class Block:
    """One running `run:` block: its process group, its log file and what it exited with."""

    name: str
    popen: subprocess.Popen
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait(self, timeout_s: float) -> int:
        return self.popen.wait(timeout=timeout_s)

    def signal(self, sig: int) -> None:
        """To the whole job, as SkyPilot's job controller (or a node going away) reaches it."""
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)

    def stop(self) -> None:
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait()


def task_env(task, base: Mapping[str, str]) -> dict[str, str]:
    """What the block sees: the machine's environment, the task's envs, its secrets' values."""
    env = dict(base)
    env.update({k: str(v) for k, v in task.envs.items()})
    env.update({k: v.get_secret_value() for k, v in task.secrets.items()})
    # SkyPilot's node runs `python` from the image's environment; here it is this project's venv.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def start_block(task, name: str, workdir: Path, logs: Path, base_env: Mapping[str, str]) -> Block:
    """Write the task's run section to a script and run it with bash in `workdir`, in its own process group."""
    logs.mkdir(parents=True, exist_ok=True)
    script = logs / f"{name}.sh"
    script.write_text(task.run)
    log = logs / f"{name}.log"
    with open(log, "w") as out:
        popen = subprocess.Popen(
            ["bash", str(script)],
            cwd=workdir,
            env=task_env(task, base_env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Block(name, popen, log)


_STUB = """#!/bin/bash
# Records its argv (program name first) as one record: fields end with 0x1f, the record with 0x1e.
line=$(printf '%s\\x1f' "$(basename "$0")" "$@")
printf '%s\\x1e' "$line" >> "$STUB_ARGV_LOG"
"""


def stub_run(task, workdir: Path, base_env: Mapping[str, str], programs=("python", "redis-server")) -> list[list[str]]:
    """Run the task's `run:` block with bash, its `programs` replaced by stubs that only record their argv: every
    command the block would start on a node, with the envs expanded as bash expands them (in the order they ran;
    the stages of a pipeline may come in either order). A command `python -m resources.run_status ... -- CMD`
    (the spot worker's supervisor) is recorded as itself and CMD."""
    stubs = workdir / "stub-bin"
    stubs.mkdir(parents=True, exist_ok=True)
    for name in programs:
        (stubs / name).write_text(_STUB)
        (stubs / name).chmod(0o755)
    script, log = workdir / "block.sh", workdir / "argv.log"
    script.write_text(task.run)
    log.write_text("")
    env = task_env(task, base_env)
    env.update(PATH=f"{stubs}{os.pathsep}{env['PATH']}", STUB_ARGV_LOG=str(log))
    done = subprocess.run(["bash", str(script)], cwd=workdir, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"the run block failed ({done.returncode}): {done.stderr[-2000:]}"
    commands = []
    for record in log.read_text().split("\x1e"):
        argv = record.split("\x1f")[:-1]
        if argv[:3] == ["python", "-m", "resources.run_status"] and "--" in argv:  # a supervisor: it starts the rest
            at = argv.index("--")
            commands += [argv[:at], argv[at + 1 :]]
        elif argv:
            commands.append(argv)
    return commands


@dataclass
class ArgvWatch:
    """Scans every process's command line (/proc/*/cmdline) for a secret while a test runs."""

    secret: bytes
    hits: list[str] = field(default_factory=list)
    scans: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "ArgvWatch":
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    argv = cmdline.read_bytes()
                except OSError:
                    continue  # the process ended meanwhile
                if self.secret in argv:
                    self.hits.append(argv.replace(b"\0", b" ").decode(errors="replace"))
            self.scans += 1
            self._stop.wait(0.1)


def wait_for(predicate, timeout_s: float, what: str, blocks: list[Block] = ()) -> None:
    """Poll `predicate` until true; fail naming `what` with the blocks' log tails."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {b.name} (rc {b.popen.poll()}):\n{b.text()[-3000:]}" for b in blocks)
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}\n{tails}")
        time.sleep(0.2)
