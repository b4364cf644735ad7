"""Shared fuzz settings and the input counter (printed at the end of a session by conftest.py).

A quick pass by default; a long run with SPOTLIGHT_FUZZ_EXAMPLES=N (docs/FUZZING.md). The
settings are applied per test (`@FUZZ`), so other hypothesis tests keep their own.
"""

from __future__ import annotations

import os
from collections import Counter

from hypothesis import HealthCheck, settings

EXAMPLES = int(os.environ.get("SPOTLIGHT_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,  # a shared CI machine: no per-input time limit
    database=None,  # nothing written into the checkout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
INPUTS: Counter[str] = Counter()


def count_input(decoder: str) -> None:
    """Call once per input a property feeds to a decoder."""
    INPUTS[decoder] += 1
