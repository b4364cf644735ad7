"""What the layout promises at run time: no dagster in workers, an instant CLI, the Dagster definitions.

Who may import whom is checked statically by import-linter (tests/test_layering.py).
"""

import subprocess
import sys

from tests.paths import REPO_ROOT

ROOT = REPO_ROOT
ITERATION_ASSETS = {"weight_patch", "rollouts", "exploration", "policy_update", "seed_plan", "validation", "report"}
"""One asset per phase of an iteration, in the `iteration` dynamic partitions."""


def test_importing_every_worker_module_loads_no_dagster():
    modules = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts)
        for p in (ROOT / "workers").rglob("*.py")
        if p.name != "__main__.py"
    )  # importing an entry point runs it
    code = "import importlib, sys\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "assert not any(m.split('.')[0] == 'dagster' for m in sys.modules), 'dagster was imported'"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_cli_module_imports_no_torch_so_help_is_instant():
    code = "import sys; import pipelines.cli; assert 'torch' not in sys.modules and 'dagster' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_dagster_definitions_expose_the_iteration_assets_job_and_sensor():
    import dagster as dg

    from pipelines.definitions import defs

    assets = {key.to_user_string() for key in defs.resolve_all_asset_keys()}
    assert assets == ITERATION_ASSETS
    for key in defs.resolve_all_asset_keys():
        assert defs.resolve_assets_def(key).partitions_def.name == "iteration", key
    job = defs.resolve_job_def("iteration")
    assert job.partitions_def.name == "iteration"
    assert {key.to_user_string() for key in job.asset_layer.selected_asset_keys} == ITERATION_ASSETS
    sensor = defs.resolve_sensor_def("next_iteration")
    assert sensor.job_name == "iteration"
    # Stopped by default, the UI would never start iteration k+1 after k.
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
