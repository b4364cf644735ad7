"""The `iteration` dynamic partitions: one key per iteration, zero-padded like the store's keys (`it-000012`).

Dagster cannot say "iteration k depends on k-1" for dynamic partitions, so the assets of
iteration k read k-1's results from the tensor store under explicit keys and the
run-status sensor (pipelines/sensors.py) starts k+1 when k succeeds.
"""

from __future__ import annotations

import re

from dagster import AssetExecutionContext, DynamicPartitionsDefinition

from resources.keys import iteration_label

ITERATIONS = DynamicPartitionsDefinition(name="iteration")
_KEY = re.compile(r"^it-(\d{6})$")


def partition_key(iteration: int) -> str:
    """`it-000012` for iteration 12."""
    return iteration_label(iteration)


def iteration_of_key(key: str) -> int:
    match = _KEY.match(key or "")
    if match is None:
        raise ValueError(f"partition key {key!r} is not an iteration key like 'it-000012'")
    return int(match.group(1))


def iteration_of(context: AssetExecutionContext) -> int:
    """The iteration an asset run materializes."""
    return iteration_of_key(context.partition_key)
