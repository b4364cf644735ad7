"""Reading a child process's output with a deadline on every wait (a blocking readline can hang a test forever).

Example:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with ProcessLines(proc) as lines:                      # leaving the block kills a child still running
        lines.expect("ready", timeout_s=60)                # the next line, or an AssertionError naming it
        event = lines.wait_for_json(lambda e: e["event"] == "step", timeout_s=60)
        rest, stderr = lines.finish(timeout_s=30)          # waits for the exit; kills the child on timeout
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import subprocess
import threading
import time
from typing import Any, Callable

_EOF = None


class ProcessLines:
    """Threads drain the child's stdout (line by line, into a queue) and stderr (kept for messages)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        if proc.stdout is None:
            raise ValueError("start the process with stdout=subprocess.PIPE (and text=True)")
        self.proc = proc
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._stderr: list[str] = []
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True)]
        if proc.stderr is not None:
            self._readers.append(threading.Thread(target=self._read_stderr, daemon=True))
        for reader in self._readers:
            reader.start()

    def __enter__(self) -> "ProcessLines":
        return self

    def __exit__(self, *exc: object) -> None:
        """Kill the child if a failed check left it running (no process outlives its test)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(_EOF)

    def _read_stderr(self) -> None:
        for line in self.proc.stderr:
            self._stderr.append(line)

    def stderr_tail(self, chars: int = 3000) -> str:
        return "".join(self._stderr)[-chars:]

    def next_line(self, timeout_s: float, what: str = "a line") -> str:
        """The next stdout line (newline kept); AssertionError when none comes in time or the child exits first."""
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(
                f"no {what} from pid {self.proc.pid} within {timeout_s:g} s; stderr: {self.stderr_tail()}"
            ) from None
        if line is _EOF:
            self._lines.put(_EOF)  # later calls see the end too
            self.proc.wait(timeout=10)
            raise AssertionError(
                f"pid {self.proc.pid} exited ({self.proc.returncode}) before {what}; stderr: {self.stderr_tail()}"
            )
        return line

    def expect(self, text: str, timeout_s: float) -> None:
        """The next line must be `text`."""
        line = self.next_line(timeout_s, repr(text))
        assert line.rstrip("\n") == text, f"expected {text!r}, got {line!r}; stderr: {self.stderr_tail()}"

    def wait_for_json(self, predicate: Callable[[dict], bool], timeout_s: float, what: str = "the event") -> dict:
        """Skip JSON lines until one satisfies `predicate`."""
        deadline = time.monotonic() + timeout_s
        while True:
            event = json.loads(self.next_line(max(0.0, deadline - time.monotonic()), what))
            if predicate(event):
                return event

    def finish(self, timeout_s: float) -> tuple[list[str], str]:
        """Wait for the exit (SIGKILL and AssertionError past `timeout_s`): the stdout lines not read yet
        (newlines stripped) and the whole stderr."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(
                f"pid {self.proc.pid} did not exit within {timeout_s:g} s; stderr: {self.stderr_tail()}"
            ) from None
        for reader in self._readers:
            reader.join(timeout=10)
        rest = []
        while (line := self._lines.get(timeout=10)) is not _EOF:
            rest.append(line.rstrip("\n"))
        self._lines.put(_EOF)
        return rest, "".join(self._stderr)


def run_spawned(
    target: Callable[..., None], args_of: Callable[[int], tuple[Any, ...]], count: int, timeout_s: float
) -> None:
    """Run `target(*args_of(r))` in `count` spawned processes at once and wait for them; a process still alive at the
    deadline is killed. Fails (AssertionError) unless every process exited 0: its traceback is in captured stderr."""
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=args_of(r), daemon=True) for r in range(count)]
    for p in procs:
        p.start()
    try:
        for p in procs:
            p.join(timeout=timeout_s)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    assert [p.exitcode for p in procs] == [0] * count, "a rank failed (its traceback is in the captured stderr)"
