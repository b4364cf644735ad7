"""The run every iteration asset works on, as a Dagster resource: the resolved config tree (resources/settings/) with
what the code computes with, made once (workers/coordinator/run_settings.py).

`spotlight run` hands the walk one it built from its resolved config; `dagster dev` builds one from the launchpad's
config, whose schema is the tree's sections with the resolved values as defaults (pipelines/deploy.py), and saves
that config as `<run-dir>/config.yaml`.

Example:
    resource = RunConfigResource.of(resolved.config, sampling_mode="workers")
    resource.train.group_size, resource.num_iterations, resource.sampling.lease_s
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from resources.settings.config import RunConfig
from workers.coordinator.context import Sampling
from workers.coordinator.run_settings import RunSettings

SAMPLING_MODES = {
    "local_pool": "workers",
    "remote": "workers",
    "inprocess": "inprocess",
    "local_cluster": "local_cluster",
}
"""deployment.rollouts -> how the rollout phase gets its samples where a command keeps a pool for the run (`spotlight
run`): its pool's workers, like remote ones, already pull from the queue."""
WORKER_LOGS = "worker_logs"
"""In the run folder: each local worker process's stderr."""
DAGSTER_SAMPLING_MODES = {**SAMPLING_MODES, "local_pool": "local_cluster"}
"""The same in `dagster dev`, where no command outlives a run to keep a pool: local workers start per phase."""


@dataclass(frozen=True)
class RunConfigResource:
    """The run's settings as the assets read them."""

    settings: RunSettings
    sampling: Sampling

    @classmethod
    def of(cls, config: RunConfig, sampling_mode: str | None = None) -> "RunConfigResource":
        """`config` checked and derived once; `sampling_mode` (inprocess, local_cluster, workers) defaults to what
        deployment.rollouts means in `spotlight run` (SAMPLING_MODES)."""
        mode = sampling_mode or SAMPLING_MODES[config.deployment.rollouts]
        log_dir = str(Path(config.deployment.run_dir) / WORKER_LOGS)
        return cls(RunSettings.of(config), Sampling.of(config, mode, log_dir=log_dir))

    @property
    def config(self) -> RunConfig:
        return self.settings.config

    @property
    def run(self) -> str:
        return self.settings.run_name

    @property
    def preset(self) -> str:
        return self.config.preset

    @property
    def train(self):
        return self.settings.train

    @property
    def num_iterations(self) -> int:
        """Training iterations; partition it-{N} is the final one (sync and validate the last weights)."""
        return self.settings.train.iterations

    def validates(self, iteration: int) -> bool:
        """Whether iteration k's validation phase scores the held-out split (the base, every validate_every
        iterations, and the final weights)."""
        return iteration % self.settings.train.validate_every == 0 or iteration >= self.num_iterations
