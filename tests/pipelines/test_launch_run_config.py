"""`spotlight launch --config run.yaml` submits one file to every node: the run's tree as the cloud runs it, written
before the reserved node goes up, with the node's price as SkyPilot's catalog gave it. SkyPilot's API server is
faked (its own YAML round trip and secret resolution run); the node's Redis is not started (that seam has its own
tests in test_launch_cli.py), so the launch is let past its wait."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.pipelines.sky_fakes import invoke as _invoke


def test_a_launch_submits_the_same_run_config_file_to_the_reserved_node_and_every_spot_job(
    fake_sky, tmp_path, monkeypatch
) -> None:
    import resources.cloud as cloud

    monkeypatch.setattr(cloud, "wait_for_redis", lambda *args, **kwargs: None)
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
