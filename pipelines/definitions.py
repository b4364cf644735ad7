"""Dagster entry point (`[tool.dagster] module_name`): `dagster dev` from the repo root loads `defs`.

The iteration assets (weight_patch, rollouts, policy_update, seed_plan, validation,
report) and their sensor arrive with the pipeline issue; until then the code location
loads with the resources every asset will use, configured from the environment:
SPOTLIGHT_STORE (a folder or s3://bucket/prefix) and SPOTLIGHT_LEDGER (a DuckDB file).
"""

from __future__ import annotations

import os

import dagster as dg

from resources.dagster_resources import LedgerResource, TensorStoreResource

RUN_DIR = os.environ.get("SPOTLIGHT_RUN_DIR", "runs/dagster")

defs = dg.Definitions(
    resources={
        "store": TensorStoreResource(url=os.environ.get("SPOTLIGHT_STORE", f"{RUN_DIR}/store")),
        "ledger": LedgerResource(path=os.environ.get("SPOTLIGHT_LEDGER", f"{RUN_DIR}/ledger.duckdb")),
    },
)
