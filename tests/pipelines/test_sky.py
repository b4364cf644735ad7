"""The SkyPilot tasks, validated offline: they parse as SkyPilot tasks and run modules that exist."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from tests.paths import REPO_ROOT

REPO = REPO_ROOT
SKY = REPO / "sky"
YAMLS = ["reserved.yaml", "spot_workers.yaml"]


def _raw(name: str) -> dict:
    return yaml.safe_load((SKY / name).read_text())


def _python_commands(name: str, workdir: Path, envs: dict | None = None, run_config=None) -> list[list[str]]:
    """Each `python -m module args...` the task's run block starts, module first: the block run by bash with the
    YAML's envs (and `envs`, as `--env` sets them) and its secrets, `python` and `redis-server` stubbed out, on a
    node whose home (`workdir`/home) holds `run_config` (a RunConfig; default: the tree's defaults) where the task
    mounts the run's config file."""
    import os

    from resources.cloud import yaml_task
    from tests.pipelines.sky_blocks import stub_run

    task = yaml_task(name, {k: "secret-value" for k in _raw(name).get("secrets") or {}})
    task.update_envs({"RUN_DIR": str(workdir / "run"), **(envs or {})})
    home = _node_home(workdir / "home", run_config)
    return [
        argv[2:] for argv in stub_run(task, workdir, {**os.environ, "HOME": str(home)}) if argv[:2] == ["python", "-m"]
    ]


def _node_home(home: Path, run_config=None) -> Path:
    """A node's home folder holding the run's config file where the YAMLs' RUN_CONFIG says launch mounts it."""
    from resources.settings.config import RunConfig
    from resources.settings.resolve import to_yaml

    (home / _raw("reserved.yaml")["envs"]["RUN_CONFIG"]).parent.mkdir(parents=True, exist_ok=True)
    for name in YAMLS:
        (home / _raw(name)["envs"]["RUN_CONFIG"]).write_text(to_yaml(run_config or RunConfig()))
    return home


def _by_module(commands: list[list[str]]) -> dict[str, list[str]]:
    return {argv[0]: argv for argv in commands}


def test_the_sky_folder_has_no_init_file_that_would_shadow_skypilot() -> None:
    assert not (SKY / "__init__.py").exists()


@pytest.mark.parametrize("name", YAMLS)
def test_each_task_parses_as_a_skypilot_task_and_starts_with_usage(name: str) -> None:
    import sky

    task = sky.Task.from_yaml(str(SKY / name))
    assert task.name and task.run
    assert (SKY / name).read_text().startswith("# Usage:")


@pytest.mark.parametrize("name", YAMLS)
def test_each_run_module_exists(name: str, tmp_path: Path) -> None:
    commands = _python_commands(name, tmp_path)
    assert commands, f"{name}: no `python -m` line in run"
    for argv in commands:
        assert importlib.util.find_spec(argv[0]) is not None, f"{name}: module {argv[0]} does not exist"


def test_spot_workers_are_spot_on_several_gpu_types_with_eager_recovery() -> None:
    import sky

    task = sky.Task.from_yaml(str(SKY / "spot_workers.yaml"))
    assert all(r.use_spot for r in task.resources)
    assert len({tuple(r.accelerators) for r in task.resources}) >= 2
    recovery = _raw("spot_workers.yaml")["resources"]["job_recovery"]
    assert recovery["strategy"] == "EAGER_NEXT_REGION" and recovery["max_restarts_on_errors"] >= 1
    assert _raw("spot_workers.yaml")["envs"]["SPOTLIGHT_STORE"].startswith("s3://")


def test_the_spot_worker_line_is_accepted_by_the_worker_and_recovers_on_its_notice_exit_code(tmp_path: Path) -> None:
    from workers.rollout.config import parse_worker_args
    from workers.rollout.worker import build_parser, check_args

    commands = _by_module(_python_commands("spot_workers.yaml", tmp_path))
    assert sorted(commands) == ["resources.cluster.worker_events", "resources.run_status", "workers.rollout"]
    argv = commands["workers.rollout"]
    args = parse_worker_args(build_parser(), argv[1:])
    args.worker_id = "w"
    check_args(args)
    assert args.spot and args.preemption_notice == "auto"
    assert args.notice_exit_code in _raw("spot_workers.yaml")["resources"]["job_recovery"]["recover_on_exit_codes"]


def _model_run(tmp_path: Path):
    """A run on a diffusers pipeline folder (with a space in its path) on a GPU, as the tree the nodes receive."""
    from resources.settings.config import RunConfig

    model = tmp_path / "models" / "Qwen Image"
    model.mkdir(parents=True)
    (model / "model_index.json").write_text('{"_class_name": "QwenImagePipeline"}')
    return model, RunConfig(model={"model": str(model)}, train={"device": "cuda"}, workers={"lease_s": 7})


@pytest.mark.parametrize("degree", ["4", "auto"])
def test_an_sp_degree_starts_the_node_agent_over_the_nodes_gpus_as_the_worker_is_started(degree, tmp_path) -> None:
    """SP_DEGREE 2..8 or auto: `python -m workers.sp` over SkyPilot's GPUs of the node, with the rollout worker's
    queue, store, run config (its knobs, model and device), price, notice and relay; secrets never on a command
    line. Empty or 1: the rollout worker."""
    from workers.rollout.config import parse_worker_args
    from workers.sp.node_serve import build_parser, check_args, node_defaults

    model, run = _model_run(tmp_path)
    envs = {"SP_DEGREE": degree, "SKYPILOT_NUM_GPUS_PER_NODE": "8"}
    commands = _python_commands("spot_workers.yaml", tmp_path / "sp", envs, run)
    assert sorted(_by_module(commands)) == ["resources.cluster.worker_events", "resources.run_status", "workers.sp"]
    assert not any("secret-value" in arg for argv in commands for arg in argv)
    argv = _by_module(commands)["workers.sp"]
    args = parse_worker_args(build_parser(), argv[1:], node_defaults)
    args.node_id = "n"
    check_args(args)  # what the node agent refuses at start (exit 2) it refuses here
    assert args.workers == 8 and args.degree == (None if degree == "auto" else 4) and args.model == str(model)
    assert args.spot and args.preemption_notice == "auto" and args.device == "cuda" and args.lease_s == 7
    assert args.notice_exit_code in _raw("spot_workers.yaml")["resources"]["job_recovery"]["recover_on_exit_codes"]
    one = _python_commands("spot_workers.yaml", tmp_path / "one", {**envs, "SP_DEGREE": "1"}, run)
    rollout = _by_module(one)
    assert sorted(rollout) == ["resources.cluster.worker_events", "resources.run_status", "workers.rollout"]
    shared = ("--queue", "--store", "--usd-per-hour", "--max-idle-s")
    for flag in shared:  # the same values as the rollout worker's line
        assert argv[argv.index(flag) + 1] == rollout["workers.rollout"][rollout["workers.rollout"].index(flag) + 1]
    assert argv[argv.index("--config") + 1].endswith("/.spotlight/run_config.yaml")
    assert _by_module(commands)["resources.cluster.worker_events"] == rollout["resources.cluster.worker_events"]


def test_the_reserved_node_is_on_demand_opens_no_port_and_takes_its_password_from_secrets() -> None:
    import sky

    task = sky.Task.from_yaml(str(SKY / "reserved.yaml"))
    assert not any(r.use_spot for r in task.resources)
    assert not any(r.ports for r in task.resources)  # SkyPilot opens ports: to 0.0.0.0/0; workers use its private IP
    raw = _raw("reserved.yaml")
    assert {"SPOTLIGHT_REDIS_PASSWORD", "SPOTLIGHT_REDIS_TLS_KEY"} <= set(raw["secrets"])
    assert not {"SPOTLIGHT_REDIS_PASSWORD", "SPOTLIGHT_REDIS_TLS_KEY"} & set(raw.get("envs") or {})
    # The password and the key reach redis-server through files written from the environment, never argv.
    assert "requirepass" not in raw["run"] and "python -m resources.queue.redis_tls" in raw["run"]


def test_the_reserved_coordinator_command_exists_in_the_cli(tmp_path: Path) -> None:
    from typer.main import get_command

    from pipelines.cli import app

    argv = _by_module(_python_commands("reserved.yaml", tmp_path))["pipelines.cli"]
    commands = get_command(app).commands
    assert argv[1] in commands, f"`spotlight {argv[1]}` is not a command"
    known = {opt for param in commands[argv[1]].params for opt in param.opts}
    used = {a for a in argv[2:] if a.startswith("--")}
    assert used <= known, f"flags the command does not take: {sorted(used - known)}"


@pytest.mark.parametrize("sp_degree", ["", pytest.param("2", marks=pytest.mark.slow)])  # SP: 2 device workers
def test_a_sigtermed_spot_job_exits_with_a_code_its_job_recovery_recovers(sp_degree, tmp_path, monkeypatch) -> None:
    """The spot task's whole run block (gate | worker or SP node agent | relay under bash), SIGTERMed as a
    preemption reaches it: every process of the job."""
    import signal

    from resources.cloud import yaml_task
    from tests.pipelines.sky_blocks import start_block, wait_for

    monkeypatch.setenv("OMP_NUM_THREADS", "1")

    task = yaml_task(
        "spot_workers.yaml",
        {"SPOTLIGHT_REDIS_PASSWORD": "unused", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"},
    )
    task.update_envs(
        {
            "SPOTLIGHT_QUEUE": str(tmp_path / "queue.db"),
            "SPOTLIGHT_STORE": str(tmp_path / "store"),
            "SP_DEGREE": sp_degree,
            "SKYPILOT_NUM_GPUS_PER_NODE": "2",
        }
    )
    (tmp_path / "store").mkdir()
    home = _node_home(tmp_path / "home")  # the tree's defaults: the CPU
    block = start_block(task, "spot", REPO, tmp_path / "logs", {**__import__("os").environ, "HOME": str(home)})
    try:
        wait_for(lambda: '"event": "ready"' in block.text(), 120, "the worker's ready event", [block])
        block.signal(signal.SIGTERM)
        code = block.wait(60)
    finally:
        block.stop()
    assert code in next(iter(task.resources)).job_recovery["recover_on_exit_codes"], block.text()[-2000:]
    assert '"event": "exit", "reason": "stopped"' in block.text()  # the relay passed the last event through


def test_both_run_blocks_hand_the_mounted_run_config_to_the_coordinator_and_every_worker(tmp_path: Path) -> None:
    """The run's settings reach the nodes in one file: `spotlight run --config` on the reserved node (its other
    flags are the cap and --resume: no run setting), `python -m workers.rollout --config` on every spot worker,
    which takes the model, its device and its knobs from it."""
    from workers.rollout.config import parse_worker_args
    from workers.rollout.worker import build_parser, check_args

    model, tree = _model_run(tmp_path)
    run = _by_module(_python_commands("reserved.yaml", tmp_path / "reserved", run_config=tree))["pipelines.cli"]
    worker = _by_module(_python_commands("spot_workers.yaml", tmp_path / "spot", run_config=tree))["workers.rollout"]
    assert run[:2] == ["pipelines.cli", "run"] and {a for a in run if a.startswith("--")} == {
        "--config",
        "--max-usd",
        "--resume",
    }
    assert run[run.index("--config") + 1] == str(tmp_path / "reserved" / "home" / ".spotlight" / "run_config.yaml")
    assert not {"--model", "--device", "--lease-s", "--commit-every"} & set(worker)
    args = parse_worker_args(build_parser(), worker[1:])
    args.worker_id = "w"
    check_args(args)  # the worker takes the folder: it holds a pipeline
    assert (args.model, args.device, args.lease_s) == (str(model), "cuda", 7)


def test_the_reserved_block_archives_the_run_and_marks_it_ended_after_the_run_line(tmp_path: Path) -> None:
    """In this order: Redis's version checked, its TLS files and config written, the run marked running (a relaunch
    resumes it), `spotlight run`, the run folder copied to the store (the node's disk goes with autostop's down), the
    run marked ended (the spot workers then stop), then every worker's ACL user revoked."""
    commands = _python_commands("reserved.yaml", tmp_path, {"SPOTLIGHT_STORE": "s3://b/p"})
    assert [argv[0] for argv in commands] == [
        "resources.queue.redis_server",
        "resources.queue.redis_tls",
        "resources.run_status",
        "pipelines.cli",
        "resources.run_archive",
        "resources.run_status",
        "resources.queue.redis_acl",
    ]
    from resources.cloud.tasks import NODE_QUEUE

    queue = NODE_QUEUE  # the queue launch places in the run's tree: the coordinator's, TLS to its own Redis
    assert commands[0][1:] == ["check", "redis-server"]
    assert commands[2][1:] == ["--queue", queue, "--mark", "running"]
    assert commands[5][1:] == ["--queue", queue, "--mark", "ended"]
    assert commands[6][1:] == ["--queue", queue, "revoke-all", "--grace-s", "90"]
    assert commands[4][1:] == ["--run-dir", str(tmp_path / "run"), "--store", "s3://b/p"]
    autostop = _raw("reserved.yaml")["resources"]["autostop"]
    assert autostop["down"] is True and autostop["wait_for"] == "jobs"


@pytest.mark.parametrize("mutual", ["yes", "no"])
def test_the_reserved_block_asks_clients_for_a_certificate_only_for_a_public_queue(tmp_path: Path, mutual) -> None:
    """REDIS_MUTUAL_TLS (launch sets "yes" with --public-queue) reaches the node's redis.conf as --mutual-tls."""
    commands = _python_commands("reserved.yaml", tmp_path, {"REDIS_MUTUAL_TLS": mutual})
    (tls,) = [argv for argv in commands if argv[0] == "resources.queue.redis_tls"]
    assert ("--mutual-tls" in tls) == (mutual == "yes")
