"""What a local cluster's workers share (`ClusterConfig`, its knobs the run config tree's) and where each runs
(`WorkerSlot`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from resources.keys import check_name
from resources.prices import load_prices
from resources.settings.config import RunConfig, WorkersSection
from resources.urls import absolute_url


@dataclass(frozen=True)
class WorkerSlot:
    """One place a worker runs; its process may be replaced after a preemption."""

    name: str
    """Slot name used by traces (w0, w1, ...); worker ids are NAME.GENERATION."""
    instance_type: str = "local-cpu"
    spot: bool = True
    """Spot slots can be preempted; reserved ones never are."""
    usd_per_hour: float | None = None
    """Price; None = from the price table for gpu_type (0 when there is no GPU type)."""
    gpu_type: str | None = None
    step_delay_s: float = 0.0
    """Extra seconds per denoising step: a slower device, simulated."""
    queue_url: str | None = None
    """This slot's own queue (static assignment); None = the cluster's shared queue. A relative path is
    made absolute against the current directory."""
    device: str | None = None
    """The worker's `--device` (resources/cluster/placement.py); None: the run config's train.device, else cpu."""
    visible_devices: str | None = None
    """The worker's CUDA_VISIBLE_DEVICES: the one GPU it samples on; None: this process's environment."""

    def __post_init__(self) -> None:
        check_name(self.name, "worker slot name")
        if self.queue_url is not None:
            object.__setattr__(self, "queue_url", absolute_url(self.queue_url))
        if self.usd_per_hour is not None and not self.usd_per_hour >= 0:
            raise ValueError(f"slot {self.name}: usd_per_hour must be >= 0, got {self.usd_per_hour}")
        if not self.step_delay_s >= 0:
            raise ValueError(f"slot {self.name}: step_delay_s must be >= 0, got {self.step_delay_s}")

    def price(self) -> float:
        if self.usd_per_hour is not None:
            return self.usd_per_hour
        if self.gpu_type is None:
            return 0.0
        return load_prices().usd_per_hour(self.gpu_type, spot=self.spot)[0]


_KNOBS = WorkersSection()
"""The worker knobs' defaults: the run config tree's, their one home."""


@dataclass(frozen=True)
class ClusterConfig:
    """What every worker of the cluster shares. Relative paths are made absolute against the current directory."""

    queue_url: str
    """The shared queue: a SQLite file path, sqlite:///abs/path.db or redis://host:port/db."""
    store_url: str
    """The tensor store: a folder, file:///abs/path or s3://bucket/prefix."""
    commit_every: int = _KNOBS.commit_every
    """Denoising steps between state commits."""
    lease_s: float = _KNOBS.lease_s
    """Queue lease: how long a SIGKILLed worker's request waits before another worker resumes it."""
    restart_delay_s: float = _KNOBS.restart_delay_s
    """Seconds until a preempted slot gets a new worker (spot capacity coming back)."""
    threads_per_worker: int = _KNOBS.worker_threads
    ready_timeout_s: float = _KNOBS.ready_timeout_s
    """How long to wait for workers to import torch and report ready."""
    run_config: str | None = None
    """The run's config.yaml (`for_run`): every worker gets `--config` it and takes its knobs (commit_every,
    lease_s, ...), the model and the device from there, instead of one flag per knob."""
    log_dir: str | None = None
    """Folder for each worker's stderr (None: inherit this process's stderr)."""
    nice: int = 0
    """Niceness added to each worker process (0-19). Workers on the trainer's own machine (a local run) at a
    higher niceness take only the CPU the trainer leaves, as spot explorers take only idle GPUs."""

    def __post_init__(self) -> None:
        if not 0 <= self.nice <= 19:
            raise ValueError(f"ClusterConfig.nice must be in [0, 19], got {self.nice}")
        # Workers are other processes: a relative path would be read against their working directory.
        for name in ("queue_url", "store_url", "log_dir", "run_config"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, absolute_url(getattr(self, name)))
        try:  # the bounds are the tree's
            WorkersSection(**{field: getattr(self, name) for field, name in _CLUSTER_KNOBS.items()})
        except ValidationError as err:
            by_field = {field: name for field, name in _CLUSTER_KNOBS.items()}
            raise ValueError(
                "; ".join(f"ClusterConfig.{by_field[e['loc'][0]]} {e['input']!r}: {e['msg']}" for e in err.errors())
            ) from None

    @classmethod
    def for_run(cls, queue_url: str, store_url: str, run_config: str | Path, **kwargs) -> "ClusterConfig":
        """The cluster of a run whose resolved config is saved at `run_config` (its config.yaml): the cluster's
        knobs come from that file's `workers` section, and each worker is handed the file (`--config`)."""
        import yaml  # lazy: only a run's cluster reads a config file

        path = Path(run_config)
        try:
            workers = RunConfig.model_validate(yaml.safe_load(path.read_text())).workers
        except OSError as err:
            raise ValueError(f"the run's config {path}: cannot read it ({err.strerror})") from None
        knobs = {name: getattr(workers, field) for field, name in _CLUSTER_KNOBS.items()}
        return cls(queue_url, store_url, run_config=str(path), **knobs, **kwargs)


_CLUSTER_KNOBS = {
    "commit_every": "commit_every",
    "lease_s": "lease_s",
    "restart_delay_s": "restart_delay_s",
    "worker_threads": "threads_per_worker",
    "ready_timeout_s": "ready_timeout_s",
}
"""WorkersSection field -> the ClusterConfig field that holds it."""
