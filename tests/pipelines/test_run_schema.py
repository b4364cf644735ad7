"""One place declares each run setting (resources/settings/): the options of `spotlight run` and `spotlight train`,
their --config keys, the SPOTLIGHT_* variables `dagster dev` reads, RunConfigResource's fields and RunSpec's fields
all follow it, and a drift in any of them (a setting missing, another help text, type or default) fails here."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest
import typer

from resources.settings import env_settings, resource_settings, settings_of

SHARED = [s for s in settings_of("run") if "train" in s.commands]


def _command(name: str):
    from pipelines.cli import app

    return typer.main.get_command(app).commands[name]


def _options(name: str) -> dict:
    return {p.name: p for p in _command(name).params if p.param_type_name == "option"}


@pytest.mark.parametrize("command", ["run", "train"])
def test_every_setting_of_a_command_is_its_option_with_the_declared_flag_help_and_choices(command):
    options = _options(command)
    for setting in settings_of(command):
        option = options.get(setting.name)
        assert option is not None, f"spotlight {command} lacks --{setting.name}"
        assert option.opts[0] == setting.cli_flag.split("/")[0], setting.name
        assert option.help.startswith(setting.help), f"spotlight {command} {setting.cli_flag}: help drifted"
        if setting.choices():
            assert tuple(option.type_descriptor.choices or ()) == setting.choices(), setting.name
    own = set(options) - {s.name for s in settings_of(command)}
    assert own == COMMAND_OWN[command], "an option that is a run setting belongs in resources/settings/"


COMMAND_OWN = {
    "run": {"run_dir", "resume", "overwrite", "max_usd", "config_file"},
    "train": {"lr", "rollouts_per_prompt", "out", "usd_per_hour", "overwrite", "as_json", "config_file"},
}
"""The options that say what a command does with its folder or output, not how the run trains."""


def test_run_and_train_share_the_help_of_every_setting_they_both_take():
    run, train = _options("run"), _options("train")
    for setting in SHARED:
        assert run[setting.name].help.startswith(train[setting.name].help.split(" Default ")[0]), setting.name


@pytest.mark.parametrize("command", ["run", "train"])
def test_the_config_file_takes_each_setting_by_its_name_and_its_flag(command):
    from pipelines.config_file import _option_names

    names = _option_names(_command(command))
    for setting in settings_of(command):
        flag = setting.cli_flag.split("/")[0][2:]
        assert names.get(setting.name) == setting.name and names.get(flag) == setting.name, setting.name


def test_the_train_command_keeps_its_own_defaults_and_run_leaves_settings_unset_for_resume():
    train, run = _options("train"), _options("run")
    assert (train["preset"].default, train["on_hacking"].default, train["device"].default) == (
        "cpu_tiny_long",
        "warn",
        "cpu",
    )
    assert (train["nproc"].default, train["prompts_heldout"].default) == (1, 0.0)
    assert all(run[s.name].default is None for s in settings_of("run"))


def test_run_config_resource_fields_are_the_schema_settings_with_their_help_and_default():
    from assets.run_config import RunConfigResource

    fields = RunConfigResource.model_fields
    assert set(fields) == {s.name for s in resource_settings()}
    for setting in resource_settings():
        assert fields[setting.name].description == setting.help, setting.name
        assert fields[setting.name].default == setting.default, setting.name


def test_run_spec_stores_exactly_the_run_settings():
    from pipelines.run import RunSpec

    names = [f.name for f in dataclasses.fields(RunSpec)]
    assert names == ["run_dir", *(s.name for s in settings_of("run"))]


def _sample(setting) -> str:
    """A valid value of the setting, as an environment variable spells it."""
    if setting.choices():
        return setting.choices()[-1]
    if setting.path:
        return "/data/file"
    kind = next(a for a in typing.get_args(setting.type) or (setting.type,) if a is not type(None))
    return {int: "3", float: "0.5", bool: "1"}.get(kind, "x")


def test_deploy_reads_the_variable_of_every_setting_that_has_one_and_checks_its_type():
    from pipelines.deploy import DeploymentError, settings_from_env

    env = {s.env_name: _sample(s) for s in env_settings()}
    values = settings_from_env(env)
    assert set(values) == {s.name for s in env_settings()}
    assert values["hacking_z"] == 0.5 and values["micro_batch"] == 3 and values["on_hacking"] == "rollback"
    assert values["model"] == str(Path("/data/file").resolve())
    with pytest.raises(DeploymentError, match="SPOTLIGHT_ON_HACKING='ignore'"):
        settings_from_env({"SPOTLIGHT_ON_HACKING": "ignore"})
    with pytest.raises(DeploymentError, match="SPOTLIGHT_HACKING_WINDOW='0'"):
        settings_from_env({"SPOTLIGHT_HACKING_WINDOW": "0"})  # the setting's bound, ge=1


def test_a_variable_reaches_the_dagster_resource_the_flag_reaches(tmp_path):
    from pipelines.deploy import resources_from_env
    from pipelines.run import RunSpec

    env = {"SPOTLIGHT_RUN_DIR": str(tmp_path), "SPOTLIGHT_PRESET": "cpu_smoke", "SPOTLIGHT_ON_HACKING": "stop"}
    env |= {"SPOTLIGHT_HACKING_Z": "3", "SPOTLIGHT_SEED": "7", "SPOTLIGHT_MICRO_BATCH": "2"}
    from_env = resources_from_env(env)["run_config"]
    spec = RunSpec(str(tmp_path / "r"), preset="cpu_smoke", on_hacking="stop", hacking_z=3.0, seed=7, micro_batch=2)
    from_flags = spec.resources()["run_config"]
    names = ("preset", "on_hacking", "hacking_z", "seed", "micro_batch")
    assert [getattr(from_env, n) for n in names] == [getattr(from_flags, n) for n in names]
    assert from_env.train_config().micro_batch == 2 and from_env.hacking_config().rule.z == 3.0


def test_a_run_stored_with_the_old_pool_name_resumes_as_the_local_pool(tmp_path):
    from pipelines.run import SPEC_NAME, RunSpec

    RunSpec(str(tmp_path), preset="cpu_smoke").save()
    stored = json.loads((tmp_path / SPEC_NAME).read_text())
    assert stored["rollouts"] == "local_pool"
    (tmp_path / SPEC_NAME).write_text(json.dumps({**stored, "rollouts": "local_cluster"}))
    spec = RunSpec.resolve(tmp_path, resume=True, rollouts="local_pool")
    assert spec.rollouts == "local_pool" and spec.resources()["rollout_workers"].mode == "workers"


def test_the_rollout_worker_gets_a_typed_config_of_its_flags():
    from workers.rollout.config import WorkerConfig
    from workers.rollout.worker import build_parser

    args = build_parser().parse_args(["--queue", "q.db", "--store", "s", "--worker-id", "w", "--commit-every", "3"])
    args.instance_type = "local-cpu"
    config = WorkerConfig.from_args(args)
    assert (config.worker_id, config.commit_every, config.spot, config.instance_type) == ("w", 3, True, "local-cpu")
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.commit_every = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="--commit-every"):
        dataclasses.replace(config, commit_every=0)


def test_the_rollout_worker_flags_default_to_its_configs_defaults():
    """A worker started with no optional flag runs on WorkerConfig's defaults, whatever they are set to."""
    from workers.rollout.config import WorkerConfig
    from workers.rollout.worker import build_parser

    args = build_parser().parse_args(["--queue", "q.db", "--store", "s", "--worker-id", "w"])
    config = WorkerConfig.from_args(args)
    assert config == WorkerConfig(worker_id="w")
