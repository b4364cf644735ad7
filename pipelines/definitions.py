"""Dagster entry point (`[tool.dagster] module_name`): `dagster dev` from the repo root loads `defs`.

The iteration assets (weight_patch, rollouts, policy_update, seed_plan, validation,
report) and their sensor arrive with the pipeline issue; until then the code location
loads with the resources every asset will use.
"""

from __future__ import annotations

import dagster as dg

defs = dg.Definitions()
