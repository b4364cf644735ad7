"""Secrets that reach the tasks: a remote reward off loopback needs SPOTLIGHT_REWARD_TOKEN (reward-serve answers 401
without it), so launch refuses to start without it and ships it to every node as a declared SkyPilot secret."""

from __future__ import annotations

import pytest

from tests.pipelines.sky_fakes import dry_run_output
from tests.pipelines.sky_fakes import invoke as _invoke

MODEL = ("--preset", "qwen_image_lora", "--model", "/models/Qwen-Image", "--prompts", "/data/prompts.jsonl")


def _launch(reward: str, *extra: str):
    return _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p", *MODEL, "--reward", reward, *extra)


def test_a_remote_reward_without_its_token_is_refused_before_anything_is_submitted(fake_sky) -> None:
    result = _launch("http://rewards.internal:8200")
    assert result.exit_code == 1 and not fake_sky.calls
    assert "the reward is served at rewards.internal: set SPOTLIGHT_REWARD_TOKEN" in result.output


def test_the_reward_token_is_a_secret_of_every_task_and_never_printed(fake_sky, monkeypatch) -> None:
    monkeypatch.setenv("SPOTLIGHT_REWARD_TOKEN", "tok-Zq81")
    result = _launch("http://10.0.3.4:8200?timeout_s=30", "--dry-run")
    assert result.exit_code == 0, result.output
    assert "tok-Zq81" not in result.output
    _, reserved, workers = dry_run_output(result.output)
    for task in (reserved, *workers):
        assert task["secrets"]["SPOTLIGHT_REWARD_TOKEN"] == "***"


@pytest.mark.parametrize("reward", ["http://127.0.0.1:8200", "http://localhost:8200", "http://[::1]:8200"])
def test_a_reward_on_the_nodes_own_loopback_needs_no_token(fake_sky, reward) -> None:
    from pipelines.launch_steps import remote_reward_hosts

    result = _launch(reward, "--dry-run")
    assert result.exit_code == 0 and remote_reward_hosts(reward), result.output
    assert "# not ready to launch" not in result.output


def test_every_secret_a_run_line_reads_is_declared_by_its_yaml() -> None:
    """Each SPOTLIGHT_* or AWS_* variable the YAMLs' setup and run read is an env or a secret of that YAML."""
    import re

    import yaml

    from tests.paths import REPO_ROOT

    setup_reads = set(re.findall(r"\$\{?(SPOTLIGHT_ENV_\w+)", (REPO_ROOT / "sky" / "setup.sh").read_text()))
    for name in ("reserved.yaml", "spot_workers.yaml"):
        raw = yaml.safe_load((REPO_ROOT / "sky" / name).read_text())
        declared = set(raw["envs"]) | set(raw["secrets"])
        assert "SPOTLIGHT_REWARD_TOKEN" in raw["secrets"] and "SPOTLIGHT_ENV_VERIFY_KEY" in raw["envs"]
        assert setup_reads - {"SPOTLIGHT_ENV_SIGNING_KEY"} <= declared
        run = raw["run"]  # the run block's own reads: less what it sets itself or gives a default, and the shell's
        run_reads = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)\b(?!:-)", run))
        run_reads -= set(re.findall(r"(?:^|\s)([A-Z_][A-Z0-9_]*)=", run)) | {"HOME", "PATH"}
        assert "REDIS_MUTUAL_TLS" in run_reads or name != "reserved.yaml"  # the scan sees the run block's reads
        assert run_reads <= declared, run_reads - declared
    assert "SPOTLIGHT_ENV_SIGNING_KEY" in yaml.safe_load((REPO_ROOT / "sky" / "reserved.yaml").read_text())["secrets"]
    assert (
        "SPOTLIGHT_ENV_SIGNING_KEY"
        not in yaml.safe_load((REPO_ROOT / "sky" / "spot_workers.yaml").read_text())["secrets"]
    )  # a spot worker never holds the key that signs the code every node runs


def test_a_short_redis_password_is_refused_before_anything_is_submitted(fake_sky, monkeypatch) -> None:
    monkeypatch.setenv("SPOTLIGHT_REDIS_PASSWORD", "hunter2-hunter2")  # 15 characters
    result = _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p")
    assert result.exit_code == 1 and not fake_sky.calls and "hunter2" not in result.output
    assert "SPOTLIGHT_REDIS_PASSWORD is 15 characters: use at least 16" in result.output
