"""Preemption traces the local cluster replays: a CSV of (time_s, worker, notice_s) or a Poisson process.

An event preempts whatever worker process occupies a slot at that moment. `notice_s`
is the warning it gets: 0 is a SIGKILL with no notice (the worker's lease expires and
another worker resumes from its last commit); > 0 is a SIGTERM (commit now, give the
request back, exit), followed by a SIGKILL if the process is still alive `notice_s`
later, as a cloud reclaims the VM when the notice runs out (AWS gives 120 s, GCP ~30 s).
Times count from the moment every initial worker reported ready.

CSV format (a header line, then one event per line; `#` starts a comment):

    time_s,worker,notice_s
    2.5,w1,0
    4.0,w2,30

Example:
    trace = poisson_trace(["w0", "w1", "w2"], rate_per_hour=600, duration_s=60, notice_share=0.5, seed=0)
    trace = load_trace_csv("trace.csv")
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from resources.keys import check_name


@dataclass(frozen=True, order=True)
class PreemptionEvent:
    """One preemption of a worker slot."""

    time_s: float
    """Seconds after the cluster's work started."""
    worker: str
    """Slot name (the process in it at that time is preempted)."""
    notice_s: float = 0.0
    """Warning before the kill: 0 = SIGKILL now; > 0 = SIGTERM now, SIGKILL after this many seconds."""

    def __post_init__(self) -> None:
        check_name(self.worker, "preempted worker slot")
        for name in ("time_s", "notice_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"PreemptionEvent.{name} must be a finite number >= 0, got {value!r}")


def load_trace_csv(path: str | Path, slots: Iterable[str] | None = None) -> list[PreemptionEvent]:
    """Read a trace CSV (see the module docstring); ValueError names the line that is wrong."""
    known = set(slots) if slots is not None else None
    lines = [line for line in Path(path).read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    rows = list(csv.reader(lines))
    if not rows or [c.strip() for c in rows[0]] != ["time_s", "worker", "notice_s"]:
        raise ValueError(f"trace {path}: the first line must be the header time_s,worker,notice_s")
    events = []
    for number, row in enumerate(rows[1:], start=2):
        try:
            if len(row) != 3:
                raise ValueError(f"expected 3 fields, got {len(row)}")
            event = PreemptionEvent(float(row[0]), row[1].strip(), float(row[2]))
        except ValueError as err:
            raise ValueError(f"trace {path}, event {number - 1} ({','.join(row)!r}): {err}") from err
        if known is not None and event.worker not in known:
            raise ValueError(
                f"trace {path}, event {number - 1}: unknown worker slot {event.worker!r}; slots are {sorted(known)}"
            )
        events.append(event)
    return sorted(events)


def poisson_trace(
    slots: Iterable[str],
    *,
    rate_per_hour: float,
    duration_s: float,
    notice_share: float = 0.5,
    notice_s: float = 2.0,
    seed: int = 0,
) -> list[PreemptionEvent]:
    """Independent Poisson preemptions on each slot at `rate_per_hour` (per worker-hour) for `duration_s`.

    A share `notice_share` of them come with `notice_s` of notice (SIGTERM first); the rest are
    SIGKILLs. Deterministic in `seed`.
    """
    names = list(slots)
    if not rate_per_hour >= 0 or not duration_s >= 0:
        raise ValueError(f"rate_per_hour and duration_s must be >= 0, got {rate_per_hour}, {duration_s}")
    if not 0 <= notice_share <= 1:
        raise ValueError(f"notice_share must lie in [0, 1], got {notice_share}")
    if not notice_s > 0:
        raise ValueError(f"notice_s must be > 0 (a notice of 0 is a SIGKILL), got {notice_s}")
    rng = random.Random(seed)
    events = []
    for name in names:
        t = 0.0
        while rate_per_hour > 0:
            t += rng.expovariate(rate_per_hour / 3600.0)
            if t >= duration_s:
                break
            events.append(PreemptionEvent(round(t, 3), name, notice_s if rng.random() < notice_share else 0.0))
    return sorted(events)
