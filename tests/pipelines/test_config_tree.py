"""One run, one config: each setting is declared once (resources/settings/config.py), resolved once (preset, files,
variables, flags), and every surface (flags, file keys, variables, the Dagster launchpad, the run's config.yaml)
follows the tree; bad input is refused before any compute, naming the key, where it was set and what is allowed."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from pipelines.cli import app
from resources.settings.config import RunConfig
from resources.settings.fields import BY_NAME, LEAVES
from resources.settings.resolve import (
    ConfigError,
    env_layer,
    file_layer,
    flag_layer,
    get_value,
    resolve,
    to_yaml,
)
from tests.paths import REPO_ROOT as REPO
from workers.trainer.presets import PRESETS, preset_config

RUNNER = CliRunner()


def _said(done) -> str:
    """The command's output as one line of words (rich boxes and wraps its errors)."""
    return " ".join(done.output.replace("│", " ").split())


def _options(name: str) -> dict:
    command = typer.main.get_command(app).commands[name]
    return {p.name: p for p in command.params if p.param_type_name == "option" and not p.hidden}


# --- declared once -------------------------------------------------------------------------------------------------

SETTINGS_HOMES = {"resources/settings/config.py", "resources/settings/sections_ops.py", "workers/trainer/presets.py"}
"""Where a setting may be declared or given a value: the tree, and the presets that fill it."""
SCANNED = ("pipelines", "assets", "resources", "workers/rollout", "workers/coordinator", "workers/sp")
"""The code between the user and the processes: where a knob declared again would drift from the tree."""
OWN_PROGRAMS = {
    "pipelines/bench_cli.py",
    "pipelines/bench_run_cli.py",
    "pipelines/sim_cli.py",
    "workers/coordinator/loco.py",
}
"""Programs with parameters of their own, not a run's: a bench's measured configuration, the simulator's, PULSELoCo's
replicas (their flags say what they measure)."""
ALIASES = {
    "num_workers": "local_workers",
    "timeout_s": "rollout_timeout_s",
    "threads_per_worker": "worker_threads",
    "threads": "worker_threads",
    "usd_per_hour": "reserved_usd_per_hour",
}
"""Names the code uses for a tree field (a Sampling, ClusterConfig or WorkerConfig field)."""


def _is_literal(node: ast.AST | None) -> bool:
    """A number, string or bool written in the code (a Field(default=...) or Option(...) of one too)."""
    if isinstance(node, ast.Constant) and node.value is not None:
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.operand, ast.Constant):
        return True
    if isinstance(node, ast.Call) and node.args:
        return _is_literal(node.args[0]) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "Field",
            "Option",
        )
    return False


def _declarations(path: Path) -> list[tuple[str, int]]:
    """(setting, line) of each class field or CLI option in `path` that gives a tree setting a literal default."""
    found = []
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and _is_literal(item.value):
                    name = ALIASES.get(item.target.id, item.target.id)
                    if name in BY_NAME and BY_NAME[name].section in ("workers", "deployment", "explore", "guard"):
                        found.append((name, item.lineno))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            flags = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            for flag in flags:
                name = ALIASES.get(flag.lstrip("-").replace("-", "_"), flag.lstrip("-").replace("-", "_"))
                if name in BY_NAME and _is_literal(default):
                    found.append((name, node.lineno))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "Option" and len(node.args) >= 2:
            flag = node.args[1]
            if isinstance(flag, ast.Constant) and isinstance(flag.value, str) and _is_literal(node.args[0]):
                name = flag.value.split("/")[0].lstrip("-").replace("-", "_")
                if name in BY_NAME:
                    found.append((name, node.lineno))
    return found


def test_no_setting_is_declared_or_defaulted_outside_the_tree():
    """A worker knob, deployment, exploration or guard setting, or any setting's flag, given a default of its own in
    the code between the user and the processes (a dataclass or pydantic field, an argparse or typer option) would
    drift from the tree: each must take the tree's (or be handed the resolved config)."""
    offenders = []
    for folder in SCANNED:
        for path in sorted((REPO / folder).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if rel in SETTINGS_HOMES or rel in OWN_PROGRAMS:
                continue
            offenders += [f"{rel}:{line} {name}" for name, line in _declarations(path)]
    assert not offenders, "declared again outside resources/settings/config.py: " + ", ".join(offenders)


NODE_LAYOUT = {"RUN_DIR", "SPOTLIGHT_STORE", "SPOTLIGHT_QUEUE"}
"""Envs of the sky YAMLs that are not a second home: RUN_DIR is the node's layout, which `spotlight launch` reads from
reserved.yaml and places on the tree (resources/cloud/tasks.py); SPOTLIGHT_STORE is a by-hand placeholder that launch
sets from the tree's deployment.store; a spot worker's SPOTLIGHT_QUEUE is the reserved node's address, known only once
that node is up (the tree's queue is the node's own 127.0.0.1)."""


def test_the_sky_tasks_declare_no_run_setting():
    """The YAMLs receive the resolved config; none of their envs is a run setting with a value of its own."""
    names = {leaf.name.upper() for leaf in LEAVES.values()} | {leaf.env for leaf in LEAVES.values()}
    names -= NODE_LAYOUT
    for path in sorted((REPO / "sky").glob("*.yaml")):
        envs = (yaml.safe_load(path.read_text()) or {}).get("envs") or {}
        declared = sorted(k for k, v in envs.items() if k in names and v not in (None, ""))
        assert not declared, f"{path.name} declares run settings {declared}: ship them in the run's config"


def test_field_names_are_unique_across_sections_so_each_flag_and_variable_names_one_setting():
    assert len(BY_NAME) == len(LEAVES)
    assert len({leaf.flag for leaf in LEAVES.values()}) == len(LEAVES)
    assert len({leaf.env for leaf in LEAVES.values()}) == len(LEAVES)


@pytest.mark.parametrize("command", ["run", "config"])
def test_every_leaf_is_an_option_of_run_and_config_with_its_help_type_and_choices(command):
    options = _options(command)
    for key, leaf in LEAVES.items():
        option = options.get(leaf.name)
        assert option is not None, f"spotlight {command} lacks {leaf.flag}"
        assert option.opts[0] == leaf.flag, key
        assert option.default is None, f"{leaf.flag}: an option's default would hide the layers under it"
        assert option.help.startswith(leaf.help), key
        if leaf.choices():
            assert tuple(option.type_descriptor.choices) == leaf.choices(), key


def test_train_takes_the_tree_but_the_worker_pool_and_the_deployment_save_its_price():
    options = _options("train")
    assert "group_size" in options and "lr" in options and "reserved_usd_per_hour" in options
    assert not {"local_workers", "lease_s", "store", "queue", "rollouts"} & set(options)


def test_the_trainer_configs_take_every_field_from_the_tree_not_from_their_own_defaults():
    """Give every recipe leaf a value unlike its default: each must reach TrainConfig / GRPOConfig / SamplerConfig."""
    from workers.trainer.from_config import train_config

    config = preset_config("cpu_tiny").model_copy(deep=True)
    data = config.model_dump()
    data["train"] |= dict(
        iterations=7, seed=3, prompts_per_iteration=3, group_size=5, rollouts_per_prompt=6, minibatches=3,
        epochs=2, micro_batch=2, objective="nft", lr=3e-4, lr_warmup_steps=4, lr_schedule="cosine",
        weight_decay=0.01, max_grad_norm=0.5, clip_range=2e-4, adv_clip=3.0, adv_norm="batch", kl_beta=0.1,
        kl_form="flow_grpo", nft_beta=0.5, nft_timesteps=3, nft_adv_scale=1.5, nft_weighting="velocity",
    )  # fmt: skip
    data["sampling"] |= dict(num_steps=6, noise_level=0.5, shift=2.0, sde_window=(1, 3), forward_dtype="fp32")
    data["sampling"] |= dict(rollout_batch=4, seeds_per_request=3)
    data["validation"] |= dict(validate_every=3, validation_seeds=4)
    train = train_config(RunConfig.model_validate(data))
    t, s, v = data["train"], data["sampling"], data["validation"]
    assert (train.iterations, train.seed, train.prompts_per_iteration, train.group_size) == (7, 3, 3, 5)
    assert (train.rollouts_per_prompt, train.micro_batch, train.rollout_batch, train.seeds_per_request) == (6, 2, 4, 3)
    assert (train.validate_every, train.validation_seeds) == (v["validate_every"], v["validation_seeds"])
    renames = {"num_minibatches": "minibatches", "num_epochs": "epochs"}
    for field in ("lr", "clip_range", "adv_clip", "adv_norm", "kl_beta", "kl_form", "num_epochs", "num_minibatches",
                  "max_grad_norm", "lr_warmup_steps", "lr_schedule", "weight_decay", "objective", "nft_beta",
                  "nft_timesteps", "nft_adv_scale", "nft_weighting"):  # fmt: skip
        assert getattr(train.grpo, field) == t[renames.get(field, field)], field
    for field in ("num_steps", "noise_level", "shift", "sde_window", "forward_dtype"):
        assert getattr(train.sampler, field) == s[field], field


def test_every_preset_is_a_whole_config_that_names_itself():
    for name, make in PRESETS.items():
        config = make()
        assert isinstance(config, RunConfig) and config.preset == name
        assert (make.__doc__ or "").strip(), f"preset {name} says nothing of the recipe it follows"


# --- resolved once, in one order -----------------------------------------------------------------------------------


def test_layers_apply_in_order_preset_file_variable_flag_and_say_where_each_value_came_from(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("preset: cpu_smoke\ntrain:\n  group_size: 6\n  seed: 4\nsampling.num_steps: 3\nlease-s: 7\n")
    layers = [file_layer(run), env_layer({"SPOTLIGHT_SEED": "5", "SPOTLIGHT_LR": "0.001"}), flag_layer({"seed": 6})]
    resolved = resolve(layers, PRESETS)
    c = resolved.config
    assert (c.preset, c.train.group_size, c.sampling.num_steps, c.workers.lease_s) == ("cpu_smoke", 6, 3, 7.0)
    assert (c.train.seed, c.train.lr) == (6, 0.001)  # the flag beats the variable, which beats the file
    assert resolved.origin("train.group_size") == f"{run}:3"
    assert resolved.origin("sampling.num_steps") == f"{run}:5"
    assert resolved.origin("train.lr") == "SPOTLIGHT_LR"
    assert resolved.origin("train.seed") == "--seed"
    assert resolved.origin("train.iterations") == "preset"  # cpu_smoke's 2
    assert resolved.origin("train.kl_beta") == "default"


def test_spotlight_config_explain_names_each_values_origin(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("preset: cpu_smoke\ngroup_size: 6\n")
    done = RUNNER.invoke(app, ["config", "--config", str(run), "--explain", "--seed", "9"])
    assert done.exit_code == 0, done.output
    rows = {line.split()[0]: line.split()[-1] for line in done.output.splitlines()}
    assert rows["train.group_size"] == f"{run}:2" and rows["train.seed"] == "--seed"
    assert rows["train.iterations"] == "preset"


def test_the_three_views_of_one_run_file_agree_config_saved_and_dagster(tmp_path, tiny_policy):
    """`spotlight config --config run.yaml`, the config.yaml a run saves, and the Dagster launchpad's defaults are
    one tree."""
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "ckpt")
    run = tmp_path / "run.yaml"
    run.write_text(
        f"preset: cpu_smoke\ntrain:\n  iterations: 1\n  group_size: 4\n  seed: 3\n"
        f"model.checkpoint: {tmp_path / 'ckpt'}\n"
        "validation.validate_every: 1\ndeployment.rollouts: inprocess  # what spotlight train does\n"
    )
    shown = RUNNER.invoke(app, ["config", "--config", str(run)], env={"COLUMNS": "300"})
    assert shown.exit_code == 0, shown.output
    out = tmp_path / "out"
    done = RUNNER.invoke(app, ["train", "--config", str(run), "--out", str(out)], env={"COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    printed, saved = yaml.safe_load(shown.output), yaml.safe_load((out / "config.yaml").read_text())
    assert saved["deployment"]["run_dir"] == str(out)
    saved["deployment"]["run_dir"] = printed["deployment"]["run_dir"]  # train's --out is the run's folder
    assert saved == printed
    assert oct((out / "config.yaml").stat().st_mode & 0o777) == "0o600"

    from pipelines.deploy import definitions_resources

    definition = definitions_resources({"SPOTLIGHT_CONFIG": str(run)})["run_config"]
    defaults = {
        name: field.default_value for name, field in definition.config_schema.as_field().config_type.fields.items()
    }  # noqa: E501
    assert RunConfig.model_validate(defaults).model_dump(mode="json") == printed


def test_the_launchpad_shows_the_trees_sections_and_a_launched_config_is_checked(tmp_path):
    import dagster as dg

    from pipelines.deploy import definitions_resources

    env = {"SPOTLIGHT_PRESET": "cpu_smoke", "SPOTLIGHT_RUN_DIR": str(tmp_path), "SPOTLIGHT_ROLLOUTS": "inprocess"}
    definition = definitions_resources(env)["run_config"]
    fields = definition.config_schema.as_field().config_type.fields
    assert list(fields) == ["preset", "model", "train", "sampling", "explore", "validation", "guard", "workers",
                            "deployment"]  # fmt: skip
    assert fields["train"].config_type.fields["group_size"].default_value == 4
    with dg.build_resources({"run_config": definition}, resource_config={"run_config": {"config": {}}}) as built:
        assert built.run_config.train.group_size == 4
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["train"]["group_size"] == 4
    bad = {"run_config": {"config": {"train": {"x": 1}}}}
    with (
        pytest.raises(dg.DagsterInvalidConfigError),
        dg.build_resources({"run_config": definition}, resource_config=bad),
    ):
        pass


# --- bad input, before any compute ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, said",
    [
        ("train:\n  grup_size: 4\n", "run.yaml:2: unknown key 'train.grup_size'; did you mean 'train.group_size'"),
        ("group_size: many\n", "run.yaml:1: train.group_size: Input should be a valid integer"),
        ("train.group_size: 1\n", "run.yaml:1: train.group_size: Input should be greater than or equal to 2"),
        ("objective: ppo\n", "run.yaml:1: train.objective: Input should be 'flow_grpo' or 'nft'"),
        ("lora_rank: 8\n", "model.lora_rank (run.yaml:1): only for a diffusers pipeline"),
        ("prompts: /nonexistent/prompts.txt\n", "run.yaml:1: train.prompts /nonexistent/prompts.txt: no such file"),
        ("workers: 3\n", "run.yaml:1: 'workers' was renamed 'workers.local_workers'"),
        ("preset: cpu_huge\n", "run.yaml:1: unknown preset 'cpu_huge'; choose one of"),
    ],
)
def test_a_bad_run_file_is_refused_naming_the_key_file_line_and_what_is_allowed(tmp_path, text, said):
    run = tmp_path / "run.yaml"
    run.write_text(text)
    with pytest.raises(ConfigError) as err:
        resolve([file_layer(run)], PRESETS)
    assert said.replace("run.yaml", str(run)) in str(err.value)


def test_a_bad_variable_is_refused_naming_it():
    with pytest.raises(ConfigError, match="SPOTLIGHT_HACKING_WINDOW: guard.hacking_window: Input should be greater"):
        resolve([env_layer({"SPOTLIGHT_HACKING_WINDOW": "0"})], PRESETS)
    with pytest.raises(ConfigError, match="deployment.rollouts 'workers' was renamed 'remote'"):
        resolve([env_layer({"SPOTLIGHT_ROLLOUTS": "workers"})], PRESETS)


def test_a_checkpoint_that_does_not_exist_is_refused_before_the_run_writes_anything(tmp_path):
    run_dir = tmp_path / "run"
    done = RUNNER.invoke(
        app, ["run", "--run-dir", str(run_dir), "--checkpoint", "/nonexistent"], env={"COLUMNS": "300"}
    )
    assert done.exit_code == 2
    assert "--checkpoint: model.checkpoint /nonexistent: no such file or folder" in _said(done)
    assert "--resume" not in _said(done) and not run_dir.exists()


def test_a_renamed_flag_is_refused_with_its_new_name():
    done = RUNNER.invoke(app, ["run", "--workers", "3"], env={"COLUMNS": "300"})
    assert done.exit_code == 2 and "--workers was renamed --local-workers" in _said(done)
    done = RUNNER.invoke(app, ["train", "--usd-per-hour", "1"], env={"COLUMNS": "300"})
    assert done.exit_code == 2 and "--usd-per-hour was renamed --reserved-usd-per-hour" in _said(done)


# --- --resume reads config.yaml ------------------------------------------------------------------------------------


def test_resume_continues_the_saved_config_and_refuses_a_change_by_name(tmp_path):
    from pipelines.run import resolve_run, save_run_config

    first = resolve_run(tmp_path / "r", resume=True, flags={"preset": "cpu_smoke", "iterations": 3}).config
    save_run_config(first)
    again = resolve_run(tmp_path / "r", resume=True, flags={}).config
    assert again == first
    moved = resolve_run(tmp_path / "r", resume=True, flags={"nproc": 1, "local_workers": 3, "micro_batch": 2}).config
    assert (moved.workers.local_workers, moved.train.micro_batch, moved.train.iterations) == (3, 2, 3)
    with pytest.raises(ConfigError, match=r"cannot change mid-run: train.iterations 5 \(--iterations; the run has 3\)"):
        resolve_run(tmp_path / "r", resume=True, flags={"iterations": 5})


def test_a_run_stored_before_config_yaml_resumes_from_its_run_json(tmp_path):
    import json

    from pipelines.run import resolve_run

    (tmp_path / "run.json").write_text(
        json.dumps({"run_dir": str(tmp_path), "preset": "cpu_smoke", "rollouts": "local_cluster", "num_workers": 3})
    )
    config = resolve_run(tmp_path, resume=True, flags={}).config
    assert (config.preset, config.deployment.rollouts, config.workers.local_workers) == ("cpu_smoke", "local_pool", 3)


def test_to_yaml_round_trips_every_preset():
    for name in PRESETS:
        config = preset_config(name)
        assert RunConfig.model_validate(yaml.safe_load(to_yaml(config))) == config, name


def test_get_value_reads_every_leaf():
    config = preset_config("cpu_smoke")
    for key, leaf in LEAVES.items():
        value = get_value(config, key)
        inner = leaf.inner
        if value is not None and typing.get_origin(inner) is None and isinstance(inner, type):
            assert isinstance(value, inner), key
