"""Typed values the request queue takes and returns: requests, leases, states, counts."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from resources.keys import check_name

KINDS_BY_PRIORITY = ("rollout", "validate", "explore")
"""Request kinds, highest priority first: a worker claims any rollout before a validation,
and any validation before an exploration (exploration runs on stale weights and may be dropped)."""
MAX_BODY_BYTES = 64 * 1024
"""A request is a small description (prompt, seed, version, sampler config); data goes in the tensor store."""
REQUEST_STATES = ("pending", "leased", "done", "dead", "cancelled", "unknown")


def check_worker_id(worker_id: str) -> str:
    """A worker id is one safe name segment (it becomes a Redis consumer name and a ledger value)."""
    return check_name(worker_id, "worker id")


def check_lease_s(lease_s: float, max_lease_s: float) -> float:
    if isinstance(lease_s, bool) or not isinstance(lease_s, (int, float)) or not 0 < lease_s <= max_lease_s:
        raise ValueError(f"lease_s must be a number in (0, {max_lease_s:g}] seconds, got {lease_s!r}")
    return float(lease_s)


@dataclass(frozen=True)
class Request:
    """One unit of work: deterministic given its payload (prompt, seed, weights version, sampler config)."""

    request_id: str
    """Unique across the queue; results are keyed by it, so it is also a store key segment."""
    iteration: int
    """The training iteration the request belongs to (cancel_iteration drops them together)."""
    kind: str
    """One of KINDS_BY_PRIORITY."""
    payload: Mapping[str, Any] = field(default_factory=dict)
    """JSON-serialisable description of the work; at most MAX_BODY_BYTES once encoded."""

    def __post_init__(self) -> None:
        check_name(self.request_id, "request id")
        if isinstance(self.iteration, bool) or not isinstance(self.iteration, int) or not 0 <= self.iteration < 2**63:
            raise ValueError(
                f"request {self.request_id!r}: iteration must be an int >= 0 and < 2**63, got {self.iteration!r:.40}"
            )
        if self.kind not in KINDS_BY_PRIORITY:
            raise ValueError(f"request {self.request_id!r}: kind must be one of {KINDS_BY_PRIORITY}, got {self.kind!r}")
        if not isinstance(self.payload, Mapping):
            raise ValueError(f"request {self.request_id!r}: payload must be a dict, got {type(self.payload).__name__}")
        size = len(self.to_json())
        if size > MAX_BODY_BYTES:
            raise ValueError(
                f"request {self.request_id!r} is {size} bytes once encoded (limit {MAX_BODY_BYTES}): "
                "put large data in the tensor store and pass its key in the payload"
            )

    @property
    def priority(self) -> int:
        """0 is claimed first."""
        return KINDS_BY_PRIORITY.index(self.kind)

    def to_json(self) -> str:
        body = {"request_id": self.request_id, "iteration": self.iteration, "kind": self.kind, "payload": self.payload}
        try:
            return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as err:
            raise ValueError(f"request {self.request_id!r}: payload is not JSON-serialisable: {err}") from err

    @classmethod
    def from_json(cls, text: str | bytes) -> "Request":
        """Parse a stored body (it comes back from a shared queue: ValueError for anything malformed)."""
        if len(text) > 2 * MAX_BODY_BYTES:  # never parse more than a body may hold (whitespace aside)
            raise ValueError(f"request body of {len(text)} bytes exceeds the {MAX_BODY_BYTES}-byte limit")
        try:
            body = json.loads(text)
        except RecursionError as err:
            raise ValueError("request body is nested too deeply to be a request") from err
        return cls.from_dict(body)

    @classmethod
    def from_dict(cls, body: "Request | Mapping[str, Any]") -> "Request":
        """Accept a Request or a dict with request_id, iteration, kind and optional payload."""
        if isinstance(body, Request):
            return body
        if not isinstance(body, Mapping):
            raise ValueError(f"a request must be a dict or Request, got {type(body).__name__}")
        missing = [k for k in ("request_id", "iteration", "kind") if k not in body]
        extra = sorted(set(body) - {"request_id", "iteration", "kind", "payload"})
        if missing or extra:
            raise ValueError(
                f"request {dict(body)!r:.200}: missing fields {missing}, unknown fields {extra}; "
                "use request_id, iteration, kind and payload"
            )
        return cls(body["request_id"], body["iteration"], body["kind"], body.get("payload", {}))


@dataclass(frozen=True)
class Lease:
    """A worker's time-limited claim on one request; keep it alive with `heartbeat`."""

    request: Request
    worker_id: str
    attempts: int
    """How many times the request has been delivered, this delivery included (1 on the first)."""
    lease_s: float
    """Lease length; each heartbeat extends the lease to this many seconds from now."""
    token: str
    """Backend identity of this delivery (a random token, or the stream entry id)."""

    @property
    def request_id(self) -> str:
        return self.request.request_id


@dataclass(frozen=True)
class DeadLetter:
    """A request given up after max_deliveries leases expired without an ack."""

    request: Request
    attempts: int
    """Deliveries made before it was dead-lettered."""


@dataclass(frozen=True)
class QueueStats:
    """Request counts by state; an expired, unclaimed lease counts as pending."""

    pending: int
    leased: int
    done: int
    dead: int
    cancelled: int

    @property
    def open(self) -> int:
        """Requests that still need a worker (pending or leased)."""
        return self.pending + self.leased


@dataclass(frozen=True)
class WaitOutcome:
    """What `wait_until_done` saw when it returned."""

    results: dict[str, str]
    """request id -> result key, for every request that is done."""
    states: dict[str, str]
    """request id -> state (one of REQUEST_STATES) of every request asked about."""

    @property
    def complete(self) -> bool:
        """True when every request reached an end state (done, dead or cancelled)."""
        return all(s in ("done", "dead", "cancelled") for s in self.states.values())

    @property
    def unfinished(self) -> list[str]:
        return sorted(r for r, s in self.states.items() if s not in ("done", "dead", "cancelled"))


def check_result_key(result_key: str) -> str:
    if not isinstance(result_key, str) or not result_key or len(result_key) > 1000:
        raise ValueError(f"result_key must be a non-empty string of at most 1000 characters, got {result_key!r:.100}")
    return result_key


def finite_positive(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a finite number > 0, got {value!r}")
    return float(value)
