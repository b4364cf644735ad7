"""How `spotlight run` stops on Ctrl-C (SIGINT) and SIGTERM: one handler for both, and a record of every delivery
that Dagster's own interrupt handling cannot swallow, read at each iteration boundary.

Dagster's in-process execution replaces the handlers of both signals while a run executes
(`dagster._utils.interrupts.capture_interrupts`, which maps SIGTERM to its SIGINT handler): inside a step's compute
the signal raises `DagsterExecutionInterruptedError` (the step fails), anywhere else it only sets a flag for the
next step to raise, and Dagster clears that flag when the run's execution ends. A signal that arrives after the last
step's compute (while Dagster records the step's success or the run's) is dropped, and the walk would go on to the
next iteration. `signal.set_wakeup_fd` makes the interpreter's C-level handler write the number of every signal
it catches to a socket, whichever Python handler then runs, so `StopSignals.check` sees those too.

Example:
    with StopSignals() as stop:
        for k in iterations:
            materialize(k)  # a signal outside Dagster's execution raises RunInterrupted here at once
            stop.check()  # RunInterrupted if one arrived while Dagster held the handlers
"""

from __future__ import annotations

import signal
import socket
import threading
from types import FrameType, TracebackType
from typing import Optional

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
SIGNAL_NAMES = {signal.SIGINT: "Ctrl-C (SIGINT)", signal.SIGTERM: "SIGTERM"}


class RunInterrupted(KeyboardInterrupt):
    """A stop signal reached the run; it stops as Ctrl-C does (`except KeyboardInterrupt` catches it)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    def __str__(self) -> str:
        return f"interrupted by {SIGNAL_NAMES.get(self.signum, signal.Signals(self.signum).name)}"


class StopSignals:
    """While entered (on the main thread): SIGINT and SIGTERM raise RunInterrupted wherever Python runs this handler,
    each time (a second Ctrl-C cuts the stop's own clean-up short), and every delivery is recorded for `check`.
    Entered off the main thread (where Python refuses handlers) it does nothing and `check` never raises."""

    def __init__(self) -> None:
        self._active = False
        self._reader: Optional[socket.socket] = None
        self._writer: Optional[socket.socket] = None
        self._previous_handlers: dict[int, object] = {}
        self._previous_wakeup_fd = -1
        self._received: Optional[int] = None

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        # Not full-buffer warnings: a burst of signals only needs its first byte read.
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._previous_handlers = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
        self._install_handlers()
        self._active = True
        return self

    def __exit__(
        self,
        exc_type: Optional[type[BaseException]],
        exc: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        if not self._active:
            return
        self._active = False
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        for end in (self._reader, self._writer):
            end.close()

    def check(self) -> None:
        """RunInterrupted when a stop signal arrived since the block began, even where another handler (Dagster's)
        ran instead of this one; also puts this handler back in case something replaced it."""
        if not self._active:
            return
        self._received = self._received or self._drain()
        self._install_handlers()
        if self._received is not None:
            raise RunInterrupted(self._received)

    def _drain(self) -> Optional[int]:
        """The first stop signal in the wakeup socket (None: none), reading it empty."""
        first = None
        while True:
            try:
                chunk = self._reader.recv(4096)
            except BlockingIOError:
                return first
            if not chunk:
                return first
            first = first or next((b for b in chunk if b in STOP_SIGNALS), None)

    def _install_handlers(self) -> None:
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Optional[FrameType]) -> None:
        self._received = self._received or signum
        raise RunInterrupted(signum)
