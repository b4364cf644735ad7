"""Step-loop hooks the rollout tests share."""

from __future__ import annotations


def stop_after(num_checks: int):
    """A `should_stop` hook that asks the worker to stop (a preemption notice) from its num_checks + 1-th check on."""
    calls = {"n": 0}

    def should_stop() -> bool:
        calls["n"] += 1
        return calls["n"] > num_checks

    return should_stop
