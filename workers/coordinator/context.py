"""What every phase of a run works on: the run's settings, its tensor store, its ledger, and who samples.

`spotlight train` builds one in process (`RunContext.local`); the Dagster assets build one
from their resources (assets/context.py). Both then call the same phase functions
(workers/coordinator/phases.py), so an iteration means the same thing everywhere.

Example:
    ctx = RunContext.local(Path("runs/demo"), "demo", "cpu_smoke", get_preset("cpu_smoke"))
    for k in range(ctx.num_iterations + 1):
        run_iteration(ctx, k)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from resources.ledger import Ledger
from resources.queue.base import QueueConfig
from resources.settings import ROLLOUT_MODES
from resources.settings.config import DeploymentSection, ExploreSection, RunConfig, ValidationSection, WorkersSection
from resources.store import open_store
from resources.store.base import TensorStore
from workers.trainer.grpo_trainer import TrainConfig


def run_name_for(run_dir: Path) -> str:
    """A run name from its folder's name, limited to the characters store keys allow."""
    name = Path(run_dir).resolve().name
    return "".join(c if c.isalnum() or c in "._=+-" else "-" for c in name).lstrip(".-") or "run"


_WORKERS = WorkersSection()
"""The worker knobs' defaults: Sampling's fields take theirs from the config tree, never a number of their own."""


@dataclass(frozen=True)
class Sampling:
    """Who samples an iteration's rollout requests, with the run's worker knobs (`Sampling.of` a RunConfig)."""

    mode: str = "inprocess"
    """inprocess (the trainer, batched), local_cluster (worker processes for the phase) or workers (already pulling)."""
    timeout_s: float = _WORKERS.rollout_timeout_s
    """Longest wait for an iteration's rollouts."""
    num_workers: int = _WORKERS.local_workers
    num_reserved: int = _WORKERS.num_reserved
    preemptions_per_hour: float = _WORKERS.preemptions_per_hour
    notice_share: float = _WORKERS.notice_share
    commit_every: int = _WORKERS.commit_every
    lease_s: float = _WORKERS.lease_s
    restart_delay_s: float = _WORKERS.restart_delay_s
    spot_usd_per_hour: float = _WORKERS.spot_usd_per_hour
    reserved_usd_per_hour: float = DeploymentSection().reserved_usd_per_hour
    log_dir: str | None = None
    explore: bool = ExploreSection().explore
    """workers: explore the next iteration's seeds beside training (False: every plan is the default one)."""
    explore_samples: float | None = None
    """inprocess: explore the next iteration's seeds in this process, on the stale weights, with a budget of this
    many full-sampler samples per iteration: what a spot pool would sample while the trainer trains, made
    deterministic (workers/explore/inprocess.py). None: in-process runs do not explore."""

    @classmethod
    def of(cls, config: RunConfig, mode: str, log_dir: str | None = None) -> "Sampling":
        """The sampling of `config` in `mode` (SAMPLING_MODES: what its deployment.rollouts means where it runs)."""
        w = config.workers
        return cls(
            mode=mode,
            timeout_s=w.rollout_timeout_s,
            num_workers=w.local_workers,
            num_reserved=w.num_reserved,
            preemptions_per_hour=w.preemptions_per_hour,
            notice_share=w.notice_share,
            commit_every=w.commit_every,
            lease_s=w.lease_s,
            restart_delay_s=w.restart_delay_s,
            spot_usd_per_hour=w.spot_usd_per_hour,
            reserved_usd_per_hour=config.deployment.reserved_usd_per_hour,
            log_dir=log_dir,
            explore=config.explore.explore,
            explore_samples=config.explore.explore_samples,
        )

    def __post_init__(self) -> None:
        if self.mode not in ROLLOUT_MODES:
            raise ValueError(f"unknown rollout mode {self.mode!r}; choose one of {ROLLOUT_MODES}")
        if self.explore_samples is not None and (self.mode != "inprocess" or not self.explore_samples > 0):
            raise ValueError(
                f"explore_samples (a budget in samples, > 0) is for in-process rollouts; got "
                f"{self.explore_samples} with mode {self.mode!r} (queue workers explore on their own time)"
            )

    @property
    def explores(self) -> bool:
        """Exploration needs workers that outlive the rollout phase: queue workers (spotlight run's run-long
        cluster, SkyPilot spot jobs). In-process rollouts have none, and a per-phase cluster is gone by training."""
        return self.mode == "workers" and self.explore

    @property
    def explores_in_process(self) -> bool:
        """In-process rollouts with an exploration budget in samples (`explore_samples`)."""
        return self.mode == "inprocess" and self.explore_samples is not None


@dataclass
class RunContext:
    """One run: its name and settings, where its state lives, and who samples."""

    run: str
    """Store prefix runs/{run}/ and the ledger's run_id."""
    preset: str
    train: TrainConfig
    store: TensorStore
    ledger: Ledger
    report_dir: Path | None
    """Report folder (index.html, plots, sample grids); None: no pictures are drawn."""
    store_url: str
    queue_url: str | None = None
    queue_config: QueueConfig = field(default_factory=QueueConfig)
    """What the run's queue clients share: deliveries, connect timeout, stall bound."""
    sampling: Sampling = field(default_factory=Sampling)
    checkpoint: str | None = None
    """Policy folder of weights version 0 (None: the shipped base), or a diffusers pipeline folder (--model)."""
    device: str = "cpu"
    """Where the trainer (and in-process sampling and validation) runs: cpu, cuda or cuda:N."""
    model: dict | None = None
    """ModelSpec fields for a diffusers pipeline folder (lora_rank, resolution, guidance, ...); None for the pixel
    policy. Checkpoints and anchors record the whole spec, so later phases rebuild the model from those."""
    anchor_every: int = DeploymentSection().anchor_every
    max_validation_drop: float = ValidationSection().max_validation_drop
    reserved_usd_per_hour: float = DeploymentSection().reserved_usd_per_hour
    report_every: int = 1
    """Rewrite the report folder (and draw the phases' pictures) every this many iterations and on the final
    one: the Dagster UI shows every iteration's; `spotlight train` draws on its validated ones."""
    keep_rollout_iterations: int | None = None
    """Iterations whose rollout results stay in the store once an iteration ends: None keeps them all (the
    pipeline's runs stay inspectable); 1 keeps the last (a redone iteration needs only its own)."""
    explore_config: Any = None
    """workers.explore.state.ExploreConfig: the arms and fallback, from the run's config (RunSettings.explore; None,
    in a context built in code: the preset's, explore_config_for); num_workers is set to the rollout workers alive
    when exploration starts."""
    validation: Any = None
    """workers.task.validation.ValidationConfig: the validation reward and held-out prompts (None: the defaults,
    MiniGenEval's detector for the pixel policy, the run's reward for a diffusers pipeline)."""
    hacking: Any = None
    """workers.coordinator.hacking_guard.HackingGuardConfig: the reward-hacking rule and what a flag does (None:
    its defaults, warn)."""
    config: RunConfig | None = None
    """The run's whole resolved config (None: a context built in code, e.g. a bench's); what worker processes are
    handed."""
    config_path: Path | None = None
    """The run's saved config.yaml, which local worker processes read (None: none saved)."""

    @property
    def num_iterations(self) -> int:
        """Training iterations; iteration N (the final one) only syncs and validates the trained weights."""
        return self.train.iterations

    def validates(self, iteration: int) -> bool:
        """Whether iteration k scores weights version k on the held-out split: the base, every validate_every
        iterations, and the final weights."""
        return iteration % self.train.validate_every == 0 or iteration >= self.num_iterations

    def is_final(self, iteration: int) -> bool:
        return iteration >= self.num_iterations

    def draws(self, iteration: int) -> bool:
        """Whether iteration k's phases draw pictures and rewrite the report folder."""
        return self.report_dir is not None and (iteration % self.report_every == 0 or self.is_final(iteration))

    @classmethod
    def local(
        cls,
        run_dir: Path,
        run: str,
        preset: str,
        train: TrainConfig,
        *,
        checkpoint: str | None = None,
        reserved_usd_per_hour: float = DeploymentSection().reserved_usd_per_hour,
        report: bool = True,
        model: dict | None = None,
        device: str = "cpu",
        validation: Any = None,
        hacking: Any = None,
    ) -> "RunContext":
        """In-process sampling, with the store, the ledger and (when `report`) the report folder in `run_dir`,
        rewritten on validated iterations, and only the last iteration's rollout results kept (each is about
        15 MB at cpu_tiny_long's 128 samples of 8 steps): what `spotlight train` uses. `validation` None:
        `default_validation` (the benches' runs validate as `spotlight train` would)."""
        run_dir = run_dir.resolve()
        store_url = str(run_dir / "store")
        if validation is None:
            validation = default_validation(train, model is not None)
        return cls(
            run,
            preset,
            train,
            open_store(store_url),
            Ledger(run_dir / "ledger.duckdb"),
            run_dir / "report" if report else None,
            store_url,
            checkpoint=checkpoint,
            model=model,
            device=device,
            validation=validation,
            hacking=hacking,
            reserved_usd_per_hour=reserved_usd_per_hour,
            report_every=train.validate_every,
            keep_rollout_iterations=1,
        )


def default_validation(train: TrainConfig, model: bool) -> Any:
    """The validation a run configured in code gets, as `spotlight train` gives it: the held-out side of a
    training prompts file that has one (MiniOCR's strings, scored with the run's reward), else the defaults
    (MiniGenEval's held-out prompts)."""
    from workers.task.validation import validation_from_options

    return validation_from_options(None, None, train.reward, model, train.prompts)


def check_device(device: str) -> str:
    """`cpu`, `cuda`, `cuda:N` or `mps`, and present on this machine; ValueError (saying what to pass) otherwise."""
    import torch

    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda", "mps") or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"device must be cpu, cuda, cuda:N or mps, got {device!r}")
    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count <= int(index or 0):
            raise ValueError(
                f"device {device!r}: this machine has {count} CUDA device(s) (torch {torch.__version__}"
                f"{', a CPU-only build' if torch.version.cuda is None else ''}); pass --device cpu"
                + (f" or --device cuda:0..{count - 1}" if count else ", or install a CUDA build of torch")
            )
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            f"device 'mps': Apple's Metal backend is not available here (torch {torch.__version__}); pass --device cpu"
        )
    return device
