"""`spotlight launch --config run.yaml` submits one file to every node: the run's tree as the cloud runs it, written
before the reserved node goes up, with the node's price as SkyPilot's catalog gave it. SkyPilot's API server is
faked (its own YAML round trip and secret resolution run); the node's Redis is not started (that seam has its own
tests in test_launch_cli.py), so the launch is let past its wait."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.pipelines.sky_fakes import SECRETS, dry_run_output, served_task
from tests.pipelines.sky_fakes import invoke as _invoke


def test_a_launch_submits_the_same_run_config_file_to_the_reserved_node_and_every_spot_job(
    fake_sky, tmp_path, monkeypatch
) -> None:
    import resources.cloud as cloud

    monkeypatch.setattr(cloud, "wait_for_redis", lambda *args, **kwargs: None)
    monkeypatch.setattr(cloud, "grant_worker_at", lambda *args, **kwargs: None)  # no node Redis here
    monkeypatch.setattr("pipelines.launch_cli._queue_info", lambda queue_url: None)  # a fresh run: nothing spent
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text("preset: cpu_smoke\nworkers:\n  lease_s: 7\ntrain.group_size: 4\n")
    result = _invoke("launch", "--config", str(run_yaml), "--spot-workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 0, result.output
    assert fake_sky.submitted == ["launch", "jobs.launch", "jobs.launch"]
    tasks = [task for _, (task, _), _ in fake_sky.calls]
    mounted = {task.file_mounts["~/" + task.envs["RUN_CONFIG"]] for task in tasks}
    assert len(mounted) == 1, mounted  # one file, the one the launch wrote
    (shipped,) = mounted
    tree = yaml.safe_load(Path(shipped).read_text())
    assert (tree["preset"], tree["train"]["group_size"], tree["workers"]["lease_s"]) == ("cpu_smoke", 4, 7.0)
    assert tree["deployment"]["store"] == "s3://b/p" and tree["deployment"]["deployment"] == "cloud"
    price = next(line for line in result.output.splitlines() if line.startswith("reserved node priced at $"))
    assert f"${tree['deployment']['reserved_usd_per_hour']:.4f}/h" in price  # the price launch found, in the file
    assert Path(shipped).stat().st_mode & 0o077 == 0  # this user's only
    assert not {"PRESET", "ITERATIONS", "MODEL", "LEASE_S", "COMMIT_EVERY", "DEVICE"} & {
        name for task in tasks for name in task.envs
    }


def test_launch_reads_every_run_settings_flag_against_the_tree_as_spotlight_run_does() -> None:
    """Flags launch does not declare: a value after the flag or after `=`, a switch and its `--no-` form, a pair;
    each remembered as its flag (what `spotlight config` would say set it)."""
    from pipelines.launch_config import resolve_launch_run, run_settings

    args = ["--lease-s=7", "--group-size", "4", "--no-explore", "--gradient-checkpointing", "--sde-window", "0,2"]
    layer = run_settings(args)
    assert layer.where == {
        "workers.lease_s": "--lease-s",
        "train.group_size": "--group-size",
        "explore.explore": "--explore",
        "train.gradient_checkpointing": "--gradient-checkpointing",
        "sampling.sde_window": "--sde-window",
    }
    run = resolve_launch_run(None, ["--store", "s3://b/p", *args], {})
    assert (run.workers.lease_s, run.train.group_size, run.explore.explore) == (7.0, 4, False)
    assert run.train.gradient_checkpointing and run.sampling.sde_window == (0, 2) and run.train.device == "cuda"
    assert resolve_launch_run(None, ["--store", "s3://b/p", "--device", "cpu"], {}).train.device == "cpu"


RUN_YAML = """\
preset: cpu_smoke
train:
  group_size: 4
  iterations: 3
workers.lease_s: 7
workers.commit_every: 3
deployment.run_dir: runs/mine
"""
PLACED = {
    "deployment.deployment": "cloud",
    "deployment.queue": "rediss://127.0.0.1:6379/0",
    "deployment.run_dir": "runs/cloud",
    "deployment.reserved_usd_per_hour": None,  # the node's price: checked in the default dry run's test
    "workers.preemptions_per_hour": 0.0,
    "train.device": "cuda",
}
"""What a launch decides for the run, over the user's file: everything else is the file's, resolved."""


def test_dry_run_run_config_is_the_resolved_tree_of_the_users_file_with_only_the_clouds_placement(
    fake_sky, tmp_path
) -> None:
    import yaml

    from resources.settings.resolve import file_layer, flag_layer, resolve
    from workers.trainer.presets import PRESETS

    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(RUN_YAML)
    result = _invoke("launch", "--config", str(run_yaml), "--spot-workers", "1", "--store", "s3://b/p", "--dry-run")
    assert result.exit_code == 0, result.output
    run_config, reserved, (worker,) = dry_run_output(result.output)
    # What `spotlight config --config run.yaml --store s3://b/p` resolves, here:
    local = resolve([file_layer(run_yaml), flag_layer({"store": "s3://b/p"})], PRESETS).config.model_dump(mode="json")
    differs = {
        f"{section}.{key}"
        for section, values in local.items()
        if isinstance(values, dict)
        for key in values
        if values[key] != run_config[section][key]
    }
    assert differs == set(PLACED) and local["preset"] == run_config["preset"] == "cpu_smoke"
    for key, value in PLACED.items():
        section, name = key.split(".")
        assert value is None or run_config[section][name] == value, key
    assert (run_config["train"]["group_size"], run_config["workers"]["lease_s"]) == (4, 7.0)
    # Both tasks mount the one file that holds that tree.
    mount = "~/.spotlight/run_config.yaml"
    (source,) = {reserved["file_mounts"][mount], worker["file_mounts"][mount]}
    assert yaml.safe_load(Path(source).read_text()) == run_config


def test_a_lease_set_once_in_run_yaml_reaches_the_spot_workers_command_through_the_shipped_file(
    fake_sky, tmp_path
) -> None:
    """The spot task as SkyPilot serves it, its file mount put where SkyPilot puts it, its run block run with stubs:
    the worker's own parser, on the command the block starts, reads the run.yaml's lease and commit interval."""
    import os
    import shutil

    from pipelines.launch_config import resolve_launch_run
    from resources.cloud import LaunchPlan, plan_tasks, ship_run_config, with_run_tls
    from resources.queue.redis_tls import make_run_tls
    from tests.pipelines.sky_blocks import stub_run
    from workers.rollout.config import parse_worker_args
    from workers.rollout.worker import build_parser

    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(RUN_YAML)
    plan = LaunchPlan(spot_workers=1, run=resolve_launch_run(run_yaml, ["--store", "s3://b/p"], {}))
    shipped = ship_run_config(plan, tmp_path / "state")
    _, spot = plan_tasks(plan, with_run_tls(SECRETS, make_run_tls()), shipped, "rediss://w@10.0.0.7:6379/0")
    served = served_task(spot)
    home = tmp_path / "node-home"
    for remote, local in served.file_mounts.items():  # what SkyPilot does on the node before the run block
        target = home / remote.removeprefix("~/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(local, target)
    commands = stub_run(served, tmp_path / "node", {**os.environ, "HOME": str(home)})
    (argv,) = [a for a in commands if a[:3] == ["python", "-m", "workers.rollout"]]
    assert argv[argv.index("--config") + 1] == str(home / ".spotlight" / "run_config.yaml")
    assert "--lease-s" not in argv and "--commit-every" not in argv and "--device" not in argv
    args = parse_worker_args(build_parser(), argv[3:])
    assert (args.lease_s, args.commit_every, args.device, args.model) == (7.0, 3, "cuda", None)


def test_launchs_old_workers_flag_is_refused_with_its_new_name(fake_sky) -> None:
    """`--workers` is the reserved node's own processes in `spotlight run`; launch's spot jobs are --spot-workers."""
    result = _invoke("launch", "--workers", "2", "--store", "s3://b/p", "--dry-run")
    assert result.exit_code == 2 and "--workers was renamed --spot-workers" in result.output
    assert "--local-workers" in result.output and not fake_sky.calls


def test_launch_with_a_model_and_no_preset_takes_the_folders_family_or_asks_for_the_preset(tmp_path) -> None:
    """A Qwen-Image folder on this machine runs its family's recipe, not the tiny CPU preset; a folder only the
    nodes have is refused before anything is submitted, naming the presets to choose from; --preset still wins."""
    import json

    import pytest

    from pipelines.launch_config import resolve_launch_run
    from resources.settings.resolve import ConfigError

    qwen = tmp_path / "Qwen-Image"
    (qwen / "transformer").mkdir(parents=True)
    (qwen / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    (qwen / "transformer" / "config.json").write_text(
        json.dumps({"num_attention_heads": 24, "attention_head_dim": 128})
    )
    run = resolve_launch_run(None, ["--store", "s3://b/p", "--model", str(qwen)], {})
    assert run.preset == "qwen_image_lora" and run.model.lora_rank is not None
    with pytest.raises(ConfigError, match=r"not on this machine.*--preset \(sd35m_lora \(sd3\), qwen_image_lora"):
        resolve_launch_run(None, ["--store", "s3://b/p", "--model", "/models/Qwen-Image"], {})
    named = ["--store", "s3://b/p", "--model", "/models/FLUX.1-dev", "--preset", "flux1_lora"]
    assert resolve_launch_run(None, named, {}).preset == "flux1_lora"
