"""What the simulator is fed: service times per model and GPU, and a learning curve, each with its source.

Service times are seconds on one GPU (SP degree 1) unless named otherwise. The
Qwen-Image-20B-like preset derives them from published figures (the sources are named per figure);
`workers/sim/measure.py` reads ours from a real run's ledger. A learning curve maps
training progress (iterations on random seeds; an iteration on explored seeds counts
`explore_speedup`) to a held-out score.

Example:
    times = model_preset("qwen-image-20b")
    curve = LearningCurve.from_ledger("runs/demo/ledger.duckdb")    # or default_curve()
    curve.score(12.5)
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from resources.ledger.db import query_ledger

GAPS = (
    "start->sync",
    "sync->rollout",
    "rollout->explore",
    "explore->validate",
    "validate->train",
    "train->explore end",
    "->iteration end",
)
"""The coordinator's hand-overs within an iteration, in order (ServiceTimes.gaps_s, IterationTimes.gaps_s)."""


@dataclass(frozen=True)
class ServiceTimes:
    """How long each piece of work takes, for one model on one GPU type."""

    model: str
    gpu_type: str
    """Priced through resources/prices.py (or the user's YAML)."""
    step_s: float
    """Seconds of one denoising step of one sample on one GPU, text encoding and VAE decode spread over it."""
    num_steps: int = 10
    """Denoising steps per rollout sample."""
    update_s_per_sample: float = 1.0
    """Trainer GPU-seconds per trained sample (forward + backward over the SDE window)."""
    sync_s: float = 5.0
    """Reserved node: publish the weight patch (PULSE) per iteration."""
    validate_s: float = 30.0
    """Reserved node: held-out validation, when it runs."""
    claim_s: float = 0.05
    """Queue round trip and request set-up per request on a worker."""
    enqueue_s: float = 0.1
    """Rollout phase start to the first claim (the coordinator's put, the workers' poll)."""
    collect_s: float = 0.2
    """Last result to the rollout phase's end (the coordinator's wait poll, result read-back)."""
    gaps_s: tuple[float, ...] = (0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5)
    """Coordinator hand-overs (GAPS): iteration start->sync, sync->rollout, rollout->explore, explore->validate,
    validate->train, train->explore end, ->iteration end."""
    between_s: float = 0.0
    """From one iteration's end to the next one's start (the report phase, the driver)."""
    startup_s: float = 120.0
    """A new worker process: start to ready (image pull, imports, model load from the store)."""
    model_load_s: float = 120.0
    """Loading the weights from scratch: a naive SP re-form or restart ("minutes", SPOTLIGHT)."""
    elastic_reform_s: float = 0.5
    """Re-forming an SP group with the persistent node scheduler ("sub-second", SPOTLIGHT)."""
    weight_copy_s: float = 5.0
    """A replacement GPU copying the weights from a live peer on its node (intra-node, elastic SP)."""
    restart_delay_s: float = 180.0
    """A preempted spot slot until its replacement process starts (a new spot VM)."""
    exit_s: float | None = None
    """A preemption to its process's end (None: when the notice runs out, as a cloud reclaims the VM;
    at once for a kill)."""
    sp_parallel_fraction: float = 0.9
    """Amdahl fraction of a sample's time that splits over an SP group (workers/sp/degree.py)."""
    sp_comm_s: float = 0.02
    """All-to-all seconds per step added by SP degree > 1."""
    min_sp_degree: int = 1
    """Smallest degree whose shards fit in GPU memory."""
    explore_request_s: float | None = None
    """Measured seconds of one exploration request (None: M x level cost x a sample's time)."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Field -> where its figure comes from."""

    def __post_init__(self) -> None:
        for name in ("step_s", "update_s_per_sample"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServiceTimes.{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if len(self.gaps_s) != len(GAPS):
            raise ValueError(
                f"ServiceTimes.gaps_s must give {len(GAPS)} hand-over times ({', '.join(GAPS)}), got {len(self.gaps_s)}"
            )
        if self.num_steps < 1 or self.min_sp_degree < 1:
            raise ValueError(
                f"ServiceTimes.num_steps and min_sp_degree must be >= 1, got {self.num_steps}, {self.min_sp_degree}"
            )

    @property
    def sample_s(self) -> float:
        """One rollout sample on one GPU."""
        return self.step_s * self.num_steps


@dataclass(frozen=True)
class IterationTimes:
    """One iteration as a replayed run measured it: the reserved node's timeline, and the rollout service times
    (None: the ServiceTimes' figure). What the simulator predicts from them is the rollout phase."""

    sync_s: float
    train_s: float
    validate_s: float | None
    """None: the iteration does not validate."""
    gaps_s: tuple[float, ...]
    """The coordinator's hand-overs (GAPS)."""
    before_s: float = 0.0
    """From the previous iteration's end (for iteration 0: the first worker's start) to this one's start."""
    explore: bool = True
    """The iteration explores (when the policy does); False where the real one did not."""
    step_s: float | None = None
    claim_s: float | None = None
    enqueue_s: float | None = None
    collect_s: float | None = None
    explore_request_s: float | None = None

    def __post_init__(self) -> None:
        if len(self.gaps_s) != len(GAPS):
            raise ValueError(f"IterationTimes.gaps_s must give {len(GAPS)} hand-over times, got {len(self.gaps_s)}")


@dataclass(frozen=True)
class WorkerTimes:
    """One worker process's life as a replayed run measured it, by worker id (None: the ServiceTimes' figure)."""

    restart_delay_s: float | None = None
    """Its slot's previous process's end to its start (a first process: the first worker's start to its start)."""
    startup_s: float | None = None
    """Its start to ready. A replay takes its first claim: an upper bound, exact whenever work was waiting
    (a worker that never claimed is ready only at its end)."""
    exit_s: float | None = None
    """Its preemption to its process's end."""


_VERL_OMNI = "verl-project/verl-omni docs/algo/performance.md: 0.51 images/GPU/s full-model Qwen-Image on 4xH200"


def qwen_image_20b(gpu_type: str = "H200", resolution: int = 512) -> ServiceTimes:
    """Qwen-Image-20B-like service times from published figures; the split and scalings are assumptions (named)."""
    if resolution not in (512, 1280):
        raise ValueError(f"--resolution must be 512 or 1280 (SPOTLIGHT's two settings), got {resolution}")
    per_image_s = 1 / 0.51  # end-to-end GPU-seconds per image, rollout + update
    scale = 1.0 if resolution == 512 else (1280 / 512) ** 2 * 1.2  # tokens x6.25, attention's extra ~20 %: assumption
    rollout_share = 0.6  # assumption: rollout 60 % of a Flow-GRPO step's GPU time (no public split)
    return ServiceTimes(
        model="qwen-image-20b",
        gpu_type=gpu_type,
        num_steps=10,
        step_s=per_image_s * rollout_share * scale / 10,
        update_s_per_sample=per_image_s * (1 - rollout_share) * scale,
        sync_s=5.0,
        validate_s=60.0,
        min_sp_degree=1 if resolution == 512 else 2,
        sources={
            "step_s": f"{_VERL_OMNI}; x0.6 rollout share (assumption) / 10 steps (Flow-GRPO Qwen-Image train steps)",
            "update_s_per_sample": f"{_VERL_OMNI}; x0.4 update share (assumption)",
            "num_steps": "Flow-GRPO's Qwen-Image setting: 10 train steps (the Flow-GRPO paper)",
            "model_load_s": "SPOTLIGHT: SP reconfiguration 'from minutes to sub-second'; 120 s taken for 'minutes'",
            "elastic_reform_s": "SPOTLIGHT: 'sub-second'",
            "restart_delay_s": "assumption: a replacement spot VM in about 3 minutes (SkyPilot relaunch)",
            "startup_s": "assumption: image pull + imports + a 40 GB BF16 load, about 2 minutes",
            "sync_s": (
                "assumption: a PULSE patch of a 20B model (about 1 % of 40 GB at 2.8 B/changed value, REFERENCES)"
            ),
            "min_sp_degree": "assumption: 1280^2 needs SP 2 to fit activations on one H200",
        },
    )


MODEL_PRESETS = {"qwen-image-20b": qwen_image_20b}


def model_preset(name: str, gpu_type: str = "H200", resolution: int = 512) -> ServiceTimes:
    if name not in MODEL_PRESETS:
        raise ValueError(f"unknown --model {name!r}; choose one of {sorted(MODEL_PRESETS)}")
    return MODEL_PRESETS[name](gpu_type, resolution)


@dataclass(frozen=True)
class LearningCurve:
    """Held-out score against training progress (piecewise linear; flat past the last point)."""

    iterations: tuple[float, ...]
    scores: tuple[float, ...]
    source: str
    """Where the points come from (shown in every report)."""

    def __post_init__(self) -> None:
        if len(self.iterations) < 2 or len(self.iterations) != len(self.scores):
            raise ValueError("a learning curve needs at least two (iteration, score) points")
        if list(self.iterations) != sorted(self.iterations) or len(set(self.iterations)) != len(self.iterations):
            raise ValueError("learning curve iterations must be increasing")

    def score(self, progress: float) -> float:
        xs, ys = self.iterations, self.scores
        if progress <= xs[0]:
            return ys[0]
        if progress >= xs[-1]:
            return ys[-1]
        i = bisect.bisect_right(xs, progress)
        w = (progress - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] + w * (ys[i] - ys[i - 1])

    @classmethod
    def from_ledger(cls, path: str | Path) -> "LearningCurve":
        """The validation table of a real run's ledger (iteration = weights version)."""
        rows = query_ledger(path, "SELECT weights_version, score FROM validation ORDER BY 1").rows
        if len(rows) < 2:
            raise ValueError(f"--curve {path}: the ledger holds {len(rows)} validations; a curve needs at least 2")
        return cls(tuple(float(r[0]) for r in rows), tuple(float(r[1]) for r in rows), f"validation table of {path}")


def curve_from_bench(
    path: str | Path, strategy: str = "random", target: float | None = None
) -> tuple[LearningCurve, float | None]:
    """A `spotlight bench exploration --json` record: `strategy`'s mean held-out curve over its run seeds, and the
    measured iterations ratio random / explore (None when a curve never reached the target). The ratio is read at
    the simulated `target`'s gain over the curve's base where the bench has that target (its targets lie on a 0.02
    grid: +0.04, +0.06, ...), else at the bench's headline target."""
    import json

    try:
        figures = json.loads(Path(path).read_text())
        learning = figures["learning"]
        mean = learning["strategies"][strategy]["mean_curve"]
        rows = learning["targets"]
        key = f"{figures['target_gain']:+.2f}"
        rows[key]  # the headline must be there: a record without it is not a bench record
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"--curve {path}: not a `spotlight bench exploration --json` record with a {strategy!r} "
            f"curve ({type(err).__name__}: {err})"
        ) from None
    asked = None if target is None else f"{target - float(mean[0]):+.2f}"
    if asked in rows:
        key = asked
    ratio = rows[key].get("random_over_explore", {}).get("ratio")
    where = f"{key}" + ("" if asked in (None, key) else f", the bench's headline (it has no {asked} target)")
    measured = (
        f"explore speedup {ratio} measured at {where}"
        if ratio is not None
        else f"no explore speedup measured at {where} (a mean curve never reached it)"
    )
    source = (
        f"MEASURED ON THE TINY CPU DiT, not Qwen-Image: {path}, {strategy} seeds, mean held-out over "
        f"{len(learning['seeds'])} run seeds; {measured}"
    )
    return LearningCurve(tuple(float(v) for v in learning["versions"]), tuple(float(x) for x in mean), source), ratio


def default_curve() -> LearningCurve:
    """A measured curve (not a Qwen-Image one): `spotlight train --seed 0` on 2 threads, cpu_tiny_long, random seeds."""
    its = tuple(float(i) for i in range(0, 45, 5))
    scores = (0.289, 0.242, 0.289, 0.281, 0.313, 0.391, 0.477, 0.445, 0.461)
    return LearningCurve(
        its,
        scores,
        "MEASURED ON THE TINY CPU DiT, not Qwen-Image: docs/BENCHMARKS.md, cpu_tiny_long "
        "seed 0 (2 threads), held-out strict at iterations 0, 5, ..., 40",
    )


def check_positive(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be a finite number > 0, got {value!r}")
    return float(value)


EPOCH_S = 1_767_225_600.0
"""Second 0 of a simulated run in its ledger (the start of 2026, UTC) of a simulated run in its ledger."""


@dataclass(frozen=True)
class Setup:
    """Everything besides the policy: where money comes from, who the workers are, what the reserved node does."""

    spot_usd_per_gpu_hour: float | None = None
    reserved_usd_per_gpu_hour: float | None = None
    """None: from the price table for times.gpu_type."""
    slots: Sequence[str] | None = None
    """Rollout slot names (None: g0, g1, ...)."""
    iterations: Sequence[IterationTimes] | None = None
    """Per-iteration measured times (None: derived from the service times)."""
    workers: Mapping[str, WorkerTimes] = field(default_factory=dict)
    """Per-worker measured start-up, restart and exit times, by worker id (`g3.1`); others use the service times."""
    epoch_s: float = EPOCH_S
