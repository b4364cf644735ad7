"""Dagster entry point (`[tool.dagster] module_name`): `dagster dev` from the repo root loads `defs`.

The iteration assets (weight_patch, rollouts, exploration, policy_update, seed_plan, validation,
report) partitioned by iteration, the `iteration` job, the sensor that starts iteration
k+1 when k succeeds, and the resources of the deployment named by SPOTLIGHT_DEPLOYMENT
(local by default; see pipelines/deploy.py for every variable). A bad configuration
fails here, when the code location loads. The deployment settings given as variables (store
URL, queue URL, ledger path) are then handed to Dagster as `EnvVar`s: resolved when a run
launches, and shown in the UI by their variable's name, never their value (a Redis URL may
hold a password).
"""

from __future__ import annotations

import os
from typing import Mapping

import dagster as dg

from assets import ITERATION_ASSETS
from pipelines.deploy import definitions_resources
from pipelines.sensors import iteration_job, next_iteration
from resources.dagster_resources import with_env_var

DEPLOYMENT_VARIABLES = {
    ("store", "url"): "SPOTLIGHT_STORE",
    ("queue", "url"): "SPOTLIGHT_QUEUE",
    ("ledger", "path"): "SPOTLIGHT_LEDGER",
}
"""(resource key, field) -> the variable that sets it (pipelines/deploy.py)."""


def with_env_vars(resources: dict, env: Mapping[str, str] = os.environ) -> dict:
    """`resources` (already checked with the variables' values) with every field of DEPLOYMENT_VARIABLES whose
    variable is set replaced by `dg.EnvVar` of it; unset ones keep their derived default (a path in the run
    folder)."""
    out = dict(resources)
    for (key, field), variable in DEPLOYMENT_VARIABLES.items():
        if env.get(variable):
            out[key] = with_env_var(out[key], field, variable)
    return out


defs = dg.Definitions(
    assets=ITERATION_ASSETS,
    jobs=[iteration_job],
    sensors=[next_iteration],
    resources=with_env_vars(definitions_resources()),
)
