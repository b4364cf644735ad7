"""The run's device reaches every local worker: the real path from the resolved config through `spotlight run`'s
pool (pipelines/run.py run_cluster) and the local cluster to each worker process's argv and environment.

No GPU here: the CUDA tests make torch in this process report GPUs, and the worker processes the cluster spawns run
the real worker's argument parsing (its `--config` and flags) and report what they would sample on, instead of
loading a model onto a GPU they cannot reach. The CPU test runs real workers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from pipelines.config_cli import resolve_settings
from resources.settings.resolve import ConfigError

SEEN_ENV = "SPOTLIGHT_TEST_WORKER_SEEN"
STAND_IN = (
    r"""
import json, os, signal, sys, threading, time
from workers.rollout.config import WorkerConfig, parse_worker_args
from workers.rollout.worker import build_parser
args = parse_worker_args(build_parser(), sys.argv[1:])
config = WorkerConfig.from_args(args)
seen = {"device": config.device, "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "argv": sys.argv[1:]}
with open(os.path.join(os.environ["%s"], config.worker_id + ".json"), "w") as out:
    json.dump(seen, out)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
print(json.dumps({"t": time.time(), "worker_id": config.worker_id, "event": "ready"}), flush=True)
stop.wait(120)
"""
    % SEEN_ENV
)
"""A worker process as far as what it was told: the real worker's parse of its argv (the run's config.yaml and the
flags), with the environment the cluster gave it."""


def _gpus(monkeypatch, count: int) -> None:
    """torch in this process sees `count` CUDA devices, as on a GPU node."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def _stand_in_workers(monkeypatch, seen: Path) -> None:
    """Worker processes that parse their argv as the worker does and report it (no model onto a missing GPU)."""
    real = subprocess.Popen
    seen.mkdir()
    monkeypatch.setenv(SEEN_ENV, str(seen))

    def popen(command, **kwargs):
        if list(command[1:3]) == ["-m", "workers.rollout"]:
            command = [command[0], "-c", STAND_IN, *command[3:]]
        return real(command, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", popen)


def _pool_of(config) -> None:
    """`spotlight run`'s run-long pool of the resolved `config`: started (every worker ready), then stopped."""
    from pipelines.deploy import build_resources
    from pipelines.run import run_cluster, save_run_config

    save_run_config(config)
    with run_cluster(config, build_resources(config)):
        pass


def _seen(folder: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]


@pytest.mark.slow
def test_a_cuda_run_pins_one_worker_to_each_gpu_its_trainer_leaves_and_injects_no_preemptions(monkeypatch, tmp_path):
    _gpus(monkeypatch, 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3,5,6")  # the GPUs a scheduler gave this job
    _stand_in_workers(monkeypatch, tmp_path / "seen")
    resolved = resolve_settings({"preset": "cpu_smoke", "device": "cuda", "run_dir": str(tmp_path / "run")}, [])
    config = resolved.config
    assert config.workers.preemptions_per_hour == 0  # the preset's 12 an hour are a CPU demo's
    assert "a GPU run injects no preemptions" in resolved.origin("workers.preemptions_per_hour")
    assert config.deployment.rollouts == "local_pool"
    _pool_of(config)
    seen = _seen(tmp_path / "seen")
    # GPU 0 trains; each other GPU gets one worker (not the preset's 2 CPU workers), seen by its node-wide name.
    assert [(s["device"], s["visible"]) for s in seen] == [("cuda", "3"), ("cuda", "5"), ("cuda", "6")]
    assert all(s["argv"][s["argv"].index("--config") + 1].endswith("config.yaml") for s in seen)


def test_a_cuda_run_on_one_gpu_samples_in_the_trainer_and_explains_why(monkeypatch, tmp_path):
    _gpus(monkeypatch, 1)
    resolved = resolve_settings({"preset": "cpu_smoke", "device": "cuda", "run_dir": str(tmp_path / "run")}, [])
    assert resolved.config.deployment.rollouts == "inprocess"
    assert "the trainer holds this machine's 1 GPU" in resolved.origin("deployment.rollouts")
    with pytest.raises(ConfigError, match="none is left for a local worker"):
        resolve_settings({"preset": "cpu_smoke", "device": "cuda", "rollouts": "local_pool"}, [])


def test_asked_for_preemptions_stay_on_a_gpu_run(monkeypatch, tmp_path):
    _gpus(monkeypatch, 2)
    flags = {"preset": "cpu_smoke", "device": "cuda", "preemptions_per_hour": 6.0, "run_dir": str(tmp_path)}
    assert resolve_settings(flags, []).config.workers.preemptions_per_hour == 6.0


@pytest.mark.slow
def test_a_cpu_run_hands_its_device_to_real_worker_processes(tmp_path):
    """Real workers, started by the run's pool: each is told --device cpu and reports sampling on the CPU (the ledger
    records the device type each worker's own ready event names)."""
    flags = {"preset": "cpu_smoke", "local_workers": 1, "run_dir": str(tmp_path / "run")}
    config = resolve_settings(flags, []).config
    assert config.train.device == "cpu" and config.workers.preemptions_per_hour == 12  # a CPU demo keeps its trace
    _pool_of(config)
    from resources.ledger import Ledger

    ledger = Ledger(str(tmp_path / "run" / "ledger.duckdb"))
    rows = ledger.query("SELECT worker_id, device_type FROM workers WHERE role = 'rollout'").rows
    assert [device for _, device in rows] == ["cpu"]
    logs = list((tmp_path / "run" / "worker_logs").glob("*.stderr"))
    assert len(logs) == 1, "the pool's worker wrote its stderr to the run's worker_logs"


def test_the_worker_parses_a_cuda_device_from_the_runs_config_and_a_flag_wins(tmp_path):
    """The cloud's workers get only `--config` (sky/spot_workers.yaml): train.device reaches them through it."""
    from resources.settings.resolve import save_config
    from workers.rollout.config import WorkerConfig, parse_worker_args
    from workers.rollout.worker import build_parser

    config = resolve_settings({"preset": "cpu_smoke", "run_dir": str(tmp_path), "device": "cuda"}, []).config
    path = save_config(config)
    base = ["--queue", "q.db", "--store", "s", "--config", str(path), "--worker-id", "w"]
    assert WorkerConfig.from_args(parse_worker_args(build_parser(), base)).device == "cuda"
    assert WorkerConfig.from_args(parse_worker_args(build_parser(), [*base, "--device", "cpu"])).device == "cpu"
