"""Dagster entry point (`[tool.dagster] module_name`): `dagster dev` from the repo root loads `defs`.

The iteration assets (weight_patch, rollouts, exploration, policy_update, seed_plan, validation,
report) partitioned by iteration, the `iteration` job, the sensor that starts iteration
k+1 when k succeeds, and the resources of the deployment named by SPOTLIGHT_DEPLOYMENT
(local by default; see pipelines/deploy.py for every variable). A bad configuration
fails here, when the code location loads.
"""

from __future__ import annotations

import dagster as dg

from assets import ITERATION_ASSETS
from pipelines.deploy import resources_from_env
from pipelines.sensors import iteration_job, next_iteration

defs = dg.Definitions(
    assets=ITERATION_ASSETS,
    jobs=[iteration_job],
    sensors=[next_iteration],
    resources=resources_from_env(),
)
