"""Where an attempt at a rollout request keeps its in-flight state, and how the next attempt finds it.

In-flight state is a cache, never the truth: an expired lease can leave two workers
holding one request, both committing state. So every attempt commits under its own key,
`{rollout_state_key}/attempt-{n}-{token}`, of which it is the only writer (the store's
publish assumes one writer per commit key); two holders can then never replace or delete
each other's objects. A later attempt reads every committed state of the request, takes
the one furthest along that reads back intact (each read takes the manifest once and the
objects it names, checksum-verified), and reports and skips anything unreadable or
inconsistent. With nothing usable it starts afresh from the request's seed: the
counter-based noise makes the result the same either way, only the steps are redone.

Example:
    key = attempt_state_key(spec.run, rid, attempt)         # this attempt's commits
    flight = resume_or_start(store, spec, rid, image_shape, report)
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

from resources.keys import rollout_state_key
from resources.store.base import TENSORS_NAME, StoreError, TensorStore
from resources.store.manifest import Manifest
from resources.store.tensors import tensors_from_bytes
from workers.rollout.state import InFlight, RolloutSpec

Report = Callable[..., None]


def attempt_state_key(run: str, request_id: str, attempt: int) -> str:
    """A commit key no other attempt writes: the attempt number (from the queue) plus a random token,
    so even two holders given the same attempt number stay apart."""
    return f"{rollout_state_key(run, request_id)}/attempt-{max(0, int(attempt)):06d}-{uuid.uuid4().hex[:12]}"


def committed_states(store: TensorStore, run: str, request_id: str) -> list[str]:
    """Commit keys of every in-flight state of the request (one per attempt that committed; also
    a state an older worker committed at `rollout_state_key` itself)."""
    return store.list_commits(rollout_state_key(run, request_id) + "/")


def resume_or_start(
    store: TensorStore, spec: RolloutSpec, request_id: str, image_shape: tuple[int, int, int], report: Report
) -> InFlight:
    """The furthest committed state that reads back intact and matches `spec`, else a fresh start."""
    candidates: list[tuple[int, str, Manifest]] = []
    for key in committed_states(store, spec.run, request_id):
        try:
            manifest = store.read_manifest(key)
        except ValueError as err:  # manifest bytes that are not a manifest
            _discard(report, request_id, key, err)
            continue
        if manifest is not None:  # None: deleted since the listing (the request finished elsewhere)
            step = manifest.metadata.get("step")
            candidates.append((step if isinstance(step, int) else -1, key, manifest))
    for _, key, manifest in sorted(candidates, key=lambda c: (-c[0], c[1])):
        try:
            tensors = tensors_from_bytes(store.load_from(manifest, TENSORS_NAME))
            return InFlight.from_commit(tensors, manifest.metadata, spec, image_shape)
        except (StoreError, ValueError) as err:
            _discard(report, request_id, key, err)
    return InFlight.fresh(spec, image_shape)


def _discard(report: Report, request_id: str, key: str, err: Exception) -> None:
    reason: Any = " ".join(str(err).split())
    report("state_discarded", request_id=request_id, key=key, reason=reason)
