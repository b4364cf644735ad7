"""The SP degree policy: which sequence-parallel degree gives a node the most throughput for its queue.

Model. A node has W workers. At degree d they form floor(W / d) groups (the rest idle);
a group samples one request at a time in latency(d) seconds. With q requests to do
(queued plus in flight), the node needs ceil(q / groups) rounds:

    makespan(d) = ceil(q / floor(W / d)) * latency(d)

and its throughput over that backlog is q / makespan(d). The policy picks the d with the
smallest makespan. Consequences: a deep queue (q >= W) favours d = 1 unless SP scales
super-linearly (it never does: the all-to-alls cost time), while a shallow queue (q < W)
lets idle workers cut the latency of the few requests left, e.g. the tail of an
iteration. Ties go to the smaller degree: fewer collectives, and a preemption breaks
fewer requests. Switching from the current degree costs a re-form (reform_s) and is only
worth it when it saves more than that.

latency(d) comes from measurement (the node agent times each request per degree) or,
until measured, from `amdahl_latency_s`.

Example:
    lat = {1: 2.0, 2: 1.2, 4: 0.8}
    choose_sp_degree(4, queue_depth=16, latency_s=lat).degree   # 1: four requests at a time
    choose_sp_degree(4, queue_depth=1, latency_s=lat).degree    # 4: one request, all hands
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class DegreeChoice:
    degree: int
    num_groups: int
    """floor(num_workers / degree)."""
    makespan_s: float
    """Predicted seconds to finish the backlog at this degree (0 for an empty queue)."""
    throughput_rps: float
    """Requests per second over the backlog (0 for an empty queue)."""


def makespan_s(num_workers: int, queue_depth: int, degree: int, latency_s: float) -> float:
    """Seconds for floor(W/d) groups to finish queue_depth requests, one at a time each."""
    groups = num_workers // degree
    if groups < 1:
        raise ValueError(f"degree {degree} exceeds the {num_workers} workers")
    return math.ceil(queue_depth / groups) * latency_s


def choose_sp_degree(
    num_workers: int,
    queue_depth: int,
    latency_s: Mapping[int, float],
    current_degree: int | None = None,
    reform_s: float = 0.0,
) -> DegreeChoice:
    """The degree (a key of latency_s, <= num_workers) with the smallest makespan; see the module doc."""
    _check_inputs(num_workers, queue_depth, latency_s, reform_s)
    degrees = sorted(d for d in latency_s if d <= num_workers)
    if not degrees:
        raise ValueError(f"no degree in {sorted(latency_s)} fits {num_workers} workers")
    choices = [_choice(num_workers, queue_depth, d, latency_s[d]) for d in degrees]
    best = min(choices, key=lambda c: (c.makespan_s, c.degree))
    if current_degree in degrees and current_degree != best.degree:
        stay = next(c for c in choices if c.degree == current_degree)
        if stay.makespan_s <= best.makespan_s + reform_s:
            return stay
    return best


def amdahl_latency_s(single_s: float, degree: int, parallel_fraction: float = 0.9, comm_s: float = 0.0) -> float:
    """Latency at `degree` when `parallel_fraction` of single_s splits d ways and SP adds comm_s."""
    if single_s <= 0 or degree < 1 or not 0 <= parallel_fraction <= 1 or comm_s < 0:
        raise ValueError("need single_s > 0, degree >= 1, 0 <= parallel_fraction <= 1, comm_s >= 0")
    extra = comm_s if degree > 1 else 0.0
    return single_s * ((1 - parallel_fraction) + parallel_fraction / degree) + extra


def _choice(num_workers: int, queue_depth: int, degree: int, latency: float) -> DegreeChoice:
    span = makespan_s(num_workers, queue_depth, degree, latency)
    rate = queue_depth / span if queue_depth else 0.0
    return DegreeChoice(degree, num_workers // degree, span, rate)


def _check_inputs(num_workers: int, queue_depth: int, latency_s: Mapping[int, float], reform_s: float) -> None:
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
    if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) or queue_depth < 0:
        raise ValueError(f"queue_depth must be an int >= 0, got {queue_depth!r}")
    if not latency_s:
        raise ValueError("latency_s must give the seconds per request of at least one degree")
    for d, s in latency_s.items():
        if not isinstance(d, int) or d < 1 or not s > 0 or math.isinf(s):
            raise ValueError(f"latency_s[{d!r}] = {s!r}: degrees must be ints >= 1, latencies finite and > 0")
    if reform_s < 0:
        raise ValueError(f"reform_s must be >= 0, got {reform_s}")
