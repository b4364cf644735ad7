"""The trainer's device: `--device cuda` on a machine without one is refused before anything is written."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

SPOTLIGHT = [sys.executable, "-m", "pipelines.cli"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
@pytest.mark.parametrize(
    "command",
    [["train", "--preset", "cpu_smoke", "--out", "out"], ["run", "--preset", "cpu_smoke", "--run-dir", "out"]],
)
def test_a_cuda_device_on_a_machine_without_one_is_refused_before_anything_is_written(tmp_path, command):
    done = subprocess.run(
        [*SPOTLIGHT, *command, "--device", "cuda"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode != 0
    assert "0 CUDA device" in done.stderr and "--device cpu" in done.stderr, done.stderr[-1500:]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "cpu:0", "mps:0"])
def test_a_device_name_that_is_not_cpu_cuda_or_mps_is_refused_at_load(device, tmp_path):
    from tests.runs import run_resources

    with pytest.raises(ValueError, match="device must be cpu, cuda, cuda:N or mps"):
        run_resources(tmp_path, preset="cpu_smoke", device=device)


def test_a_cuda_index_beyond_the_gpus_and_mps_without_metal_are_refused_saying_what_to_pass(monkeypatch):
    from workers.coordinator.context import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda:1") == "cuda:1"
    with pytest.raises(ValueError, match=r"'cuda:2': this machine has 2 CUDA device\(s\).*--device cuda:0..1"):
        check_device("cuda:2")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="'mps': Apple's Metal backend is not available here.*--device cpu"):
        check_device("mps")


def test_the_trainer_device_reaches_the_run_context_from_the_deployment(monkeypatch, tmp_path):
    """SPOTLIGHT_DEVICE / --device -> RunConfigResource -> RunContext.device, which every phase loads weights onto."""
    from assets.context import run_context
    from pipelines.deploy import resources_from_env

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on the reserved node's GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    ctx = run_context(
        **resources_from_env(
            {"SPOTLIGHT_RUN_DIR": str(tmp_path), "SPOTLIGHT_PRESET": "cpu_smoke", "SPOTLIGHT_DEVICE": "cuda:0"}
        )
    )
    assert ctx.device == "cuda:0"
    with pytest.raises(ValueError, match="1 CUDA device"):
        resources_from_env({"SPOTLIGHT_RUN_DIR": str(tmp_path), "SPOTLIGHT_DEVICE": "cuda:1"})
