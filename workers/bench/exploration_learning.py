"""`spotlight bench exploration`, the learning factor:
how many iterations each seed strategy needs to a held-out target.

SPOTLIGHT's time to target is (iterations to the target) x (critical-path seconds per
iteration). This module measures the first factor with real training runs of the
coordinator's phases in process (`spotlight train`'s path), one per strategy and run seed,
the same preset and prompt schedule for all:

- `random`: every prompt's group samples its default (random) request seeds;
- `explore`: SPOTLIGHT off the critical path: after each update, the next iteration's
  prompts are explored on the stale weights with the bandit's arm (M candidates per prompt
  at a cheap sampler level) within a budget of `explore_samples` full-sampler samples per
  iteration, what a spot pool would sample while the trainer trains
  (workers/explore/inprocess.py); the groups of largest explored reward
  variance are trained on;
- `wider_draw`: the same contrast on the critical path: each prompt draws `wider_draw` x G
  seeds at full quality on the current weights and the update keeps the G of largest
  reward variance (`TrainConfig.rollouts_per_prompt`, spotlight train's recipe);
- `random_wide` (R_2G at `wider_draw` = 2): random seeds in groups of `wider_draw` x G, every sample trained
  on: the reference at `wider_draw` times the rollout and the update of `random`.

Every run is a function of its seed (one torch thread, budgets in samples, not seconds), so
runs go in parallel processes and a record once written is reused: `out/<strategy>-s<seed>.json`.

Example:
    spec = LearningRun("explore", 0, config, explore_config, explore_samples=128.0, checkpoint=None)
    record = learning_run(spec, Path("runs/bench"))
    record["curve"], record["iterations"][4]["variance_gain"]
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from workers.coordinator.context import RunContext
from workers.rollout.kernels import cpu_identity
from workers.task.prompt_file import file_digest
from workers.trainer.grpo_trainer import TrainConfig

STRATEGIES = ("random", "explore", "wider_draw", "random_wide")
ARM_NAMES = {"random": "R_G", "explore": "E_G", "random_wide": "R_2G", "wider_draw": "wider draw"}
"""The headline's names of the strategies (docs/EXPLORATION.md, "The headline, pre-registered")."""


READER_PACKAGES = ("numpy", "onnxruntime", "rapidocr", "opencv-python-headless")
"""Packages whose version can change a run's numbers beside torch (in cpu_identity): the arrays, and the OCR
reward's reader (its model runs on onnxruntime, its images go through OpenCV)."""


def run_environment() -> dict:
    """What a run's numbers depend on besides its settings: the CPU and torch (`cpu_identity`) and READER_PACKAGES'
    versions (None where one is not installed)."""
    from importlib import metadata

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {**cpu_identity(), "packages": {name: version(name) for name in READER_PACKAGES}}


@dataclass(frozen=True)
class LearningRun:
    """One training run of the learning factor."""

    strategy: str
    seed: int
    config: TrainConfig
    """The bench's config (the strategy adds its own change)."""
    explore_config: object
    """workers.explore.state.ExploreConfig of the explore strategy."""
    explore_samples: float
    """explore: the per-iteration budget in full-sampler samples."""
    checkpoint: str | None
    """Policy folder of version 0 (None: the shipped base)."""
    wider_draw: int = 2
    """wider_draw: seeds drawn per prompt, and random_wide: its group size, as a multiple of the group size."""
    reads_base: bool = True
    """Whether the run scores weights version 0 itself. Every run reads the same base (same weights, the fixed
    held-out seeds), so a bench has one run read it and the others skip it (`with_base_reading`)."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; choose one of {STRATEGIES}")
        if self.wider_draw < 2 or not self.explore_samples > 0:
            raise ValueError(
                f"wider_draw must be >= 2 and explore_samples > 0, got {self.wider_draw}, {self.explore_samples}"
            )

    def train_config(self) -> TrainConfig:
        wide = self.wider_draw * self.config.group_size
        if self.strategy == "random_wide":
            per_request = self.config.seeds_per_request and wide  # one request per prompt stays one
            return dataclasses.replace(
                self.config, seed=self.seed, group_size=wide, seeds_per_request=per_request, rollouts_per_prompt=None
            )
        draw = wide if self.strategy == "wider_draw" else None
        return dataclasses.replace(self.config, seed=self.seed, rollouts_per_prompt=draw)

    @property
    def name(self) -> str:
        return f"{self.strategy}-s{self.seed}"

    def fingerprint(self) -> str:
        """What the record depends on: a record with another fingerprint is stale and is not reused. Files count by
        their bytes, not their place: the same prompts file and base in another clone or folder reuse the record.
        The machine counts too: the same seed on another processor model, kernel set or reader version is another
        run (`run_environment`), so records from another machine are redone, not mixed with this one's."""
        train = dataclasses.asdict(self.train_config())
        train["prompts"] = train["prompts"] and {k: v for k, v in train["prompts"].items() if k != "path"}
        fields = {
            "train": train,
            "checkpoint": self.checkpoint and Path(self.checkpoint).exists() and file_digest(Path(self.checkpoint)),
            "explore": repr(self.explore_config) if self.strategy == "explore" else None,
            "budget": self.explore_samples if self.strategy == "explore" else None,
            **({} if self.reads_base else {"reads_base": False}),  # records made before the field stay valid
            "kernels": run_environment(),
        }
        return hashlib.blake2b(json.dumps(fields, sort_keys=True, default=str).encode(), digest_size=12).hexdigest()


def learning_run(spec: LearningRun, out: Path | None = None, verbose: bool = False) -> dict:
    """The run's record (validation curve, per-iteration figures); reused from `out` when it holds this run's.
    `verbose`: a line on stderr per validation (the run's progress)."""
    path = None if out is None else Path(out) / f"{spec.name}.json"
    if path is not None and path.exists():
        record = json.loads(path.read_text())
        if record.get("fingerprint") == spec.fingerprint():
            return record
    import torch

    torch.set_num_threads(1)  # runs are deterministic on one thread and go in parallel processes
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"spotlight-bench-{spec.name}-") as tmp:
        rows, curve, exploration = _walk(spec, Path(tmp), verbose)
    record = {
        "strategy": spec.strategy,
        "seed": spec.seed,
        "fingerprint": spec.fingerprint(),
        "curve": curve,
        "iterations": rows,
        "exploration": exploration,
        "kernels": run_environment(),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps(record, sort_keys=True))
        partial.replace(path)  # a run cut off never leaves a record that looks whole
    return record


def _walk(spec: LearningRun, run_dir: Path, verbose: bool) -> tuple[list[dict], list[dict], list[dict]]:
    """Every iteration of the run through the coordinator's driver; rows, validation curve and exploration rows."""
    from workers.coordinator.context import Sampling
    from workers.coordinator.driver import train_records

    config = spec.train_config()
    ctx = RunContext.local(run_dir, spec.name, "bench", config, checkpoint=spec.checkpoint, report=False)
    if not spec.reads_base:
        ctx = _SkipsBaseReading(**{f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)})
    if spec.strategy == "explore":
        ctx = dataclasses.replace(
            ctx,
            explore_config=spec.explore_config,
            sampling=Sampling(mode="inprocess", explore_samples=spec.explore_samples),
        )
    rows, curve = [], []
    try:
        for record in train_records(ctx):
            if record.get("validation_score") is not None:
                curve.append(
                    {
                        "version": record["iteration"],
                        "score": record["validation_score"],
                        "per_category": record["validation_per_category"],
                    }
                )
                if verbose:
                    print(
                        f"{spec.name}: held-out {record['validation_score']:.3f} at version {record['iteration']}",
                        file=sys.stderr,
                        flush=True,
                    )
            if record.get("reward_std") is not None:
                rows.append(
                    {
                        name: record.get(name)
                        for name in ("iteration", "reward_mean", "reward_std", "zero_std_ratio", "loss", "step_s")
                    }
                )
        exploration = ctx.ledger.query(
            "SELECT iteration, arm, num_requests AS explored_prompts, time_used_s AS samples_used, kendall_tau, "
            "variance_gain, fallback_random FROM exploration ORDER BY iteration"
        ).as_dicts()
        payoff = {r["iteration"]: r for r in ctx.ledger.query("SELECT * FROM exploration_payoff").as_dicts()}
        seconds = _phase_seconds(ctx.ledger)
        rewards = ctx.ledger.query(
            "SELECT iteration, request_id, reward FROM requests WHERE kind = 'rollout' AND reward IS NOT NULL"
        ).rows
    finally:
        ctx.ledger.close()
    mass = _update_mass(rewards, config)
    for row in rows:
        row.update(_payoff_fields(payoff.get(row["iteration"])))
        row.update(seconds.get(row["iteration"], {}))
        row.update(mass.get(row["iteration"], {}))
    return rows, curve, exploration


def _phase_seconds(ledger) -> dict[int, dict]:
    """Per iteration, the wall seconds of its critical-path phases (sync, rollout, train) as the ledger timed them."""
    out: dict[int, dict] = {}
    for k, phase, seconds in ledger.query(
        "SELECT iteration, phase, epoch(ended_at) - epoch(started_at) FROM phases "
        "WHERE phase IN ('sync', 'rollout', 'train') AND ended_at IS NOT NULL"
    ).rows:
        out.setdefault(k, {})[f"{phase}_s"] = round(float(seconds), 4)
    return out


def _update_mass(rows: list, config: TrainConfig) -> dict[int, dict]:
    """Per iteration: the update's mass, the sum of |advantage| over the trained samples per prompt (the
    trainer's group normalisation and clip: a dead group adds 0, a live binary group of 4 between 3.46 and 4; the
    wider draw's over its whole draw, before the cut), the rollout's samples and the update's."""
    import torch

    from workers.algo.grpo import group_advantages

    by_iteration: dict[int, tuple[list[float], list[int]]] = {}
    for k, request, reward in rows:
        prompt = int(str(request).split("-")[1][1:])  # it3-p12-s7 (resources.keys.request_id)
        rewards, groups = by_iteration.setdefault(int(k), ([], []))
        rewards.append(float(reward))
        groups.append(prompt)
    out = {}
    for k, (rewards, groups) in by_iteration.items():
        adv = group_advantages(
            torch.tensor(rewards), torch.tensor(groups), clip=config.grpo.adv_clip, norm=config.grpo.adv_norm
        )
        out[k] = {
            "update_mass": round(float(adv.abs().sum()) / len(set(groups)), 4),
            "rollout_samples": len(rewards),
            "trained_samples": len(set(groups)) * config.group_size,  # the wider draw trains G of its draw
        }
    return out


@dataclass
class _SkipsBaseReading(RunContext):
    """A run that leaves the held-out reading of version 0 to another run of the bench."""

    def validates(self, iteration: int) -> bool:
        return iteration > 0 and RunContext.validates(self, iteration)


def with_base_reading(records: list[dict]) -> list[dict]:
    """Every record's curve starting at version 0: runs that skipped the base reading get the one a run made."""
    base = next((r["curve"][0] for r in records if r["curve"] and r["curve"][0]["version"] == 0), None)
    if base is None:
        raise ValueError("no learning run read the base (version 0): give one run reads_base=True")
    return [
        r if r["curve"][:1] and r["curve"][0]["version"] == 0 else {**r, "curve": [base, *r["curve"]]} for r in records
    ]


def _payoff_fields(payoff: dict | None) -> dict:
    """What the ledger's exploration_payoff view says of an iteration's rollout (explored vs random seeds)."""
    if payoff is None:
        return {}
    return {
        name: payoff.get(name)
        for name in ("explored_prompts", "explored_variance", "random_variance", "baseline_variance", "variance_ratio")
    }
