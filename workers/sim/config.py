"""What one simulated run is: the scheduling policy (a baseline or spotlight), the cluster and the workload.

The four policies are configurations of the same simulated coordinator (workers/sim/engine.py):

| policy | rollout GPUs | assignment | in-flight state | SP re-form | exploration |
|---|---|---|---|---|---|
| `roll` (ROLL-like) | reserved (on-demand) | pull | - (never preempted) | - | no |
| `naive_spot` | spot | static (one queue per node) | lost: restart from step 0 | from scratch | no |
| `rlboost` (RLBoost-like) | spot | pull | committed every c steps and on notice | from scratch | no |
| `spotlight` | spot | pull | committed every c steps and on notice | elastic | UCB bandit |
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from resources.settings.config import WorkersSection

_KNOBS = WorkersSection()
"""The run's worker knobs' defaults (the config tree's), which the simulated run shares."""


@dataclass(frozen=True)
class SchedulingPolicy:
    """How the coordinator schedules rollouts and survives preemptions."""

    name: str
    spot: bool = True
    """Rollout GPUs are spot (preemptible, spot price) or reserved (on-demand price, never preempted)."""
    pull: bool = True
    """One shared queue every worker pulls from; False: requests dealt to nodes up front (one queue each)."""
    commits: bool = True
    """Workers commit in-flight state every `commit_every` steps and on a notice; False: restart from step 0."""
    elastic_sp: bool = True
    """SP groups re-form in `elastic_reform_s` and replacements copy weights from a peer; False: reload from scratch."""
    explore: bool = True
    """Explore the next iteration's seeds on stale weights while training (the UCB bandit picks the arm)."""


POLICIES = {
    "roll": SchedulingPolicy("roll", spot=False, pull=True, commits=False, elastic_sp=False, explore=False),
    "naive_spot": SchedulingPolicy("naive_spot", pull=False, commits=False, elastic_sp=False, explore=False),
    "rlboost": SchedulingPolicy("rlboost", pull=True, commits=True, elastic_sp=False, explore=False),
    "spotlight": SchedulingPolicy("spotlight"),
}
POLICY_LABELS = {
    "roll": "reserved-only sync (ROLL-like)",
    "naive_spot": "naive spot",
    "rlboost": "pull + commits (RLBoost-like)",
    "spotlight": "spotlight",
}


@dataclass(frozen=True)
class SimConfig:
    """One simulated run."""

    policy: SchedulingPolicy
    num_spot_gpus: int = 8
    """Rollout GPUs (spot, or reserved for `roll`)."""
    num_trainer_gpus: int = 8
    """Reserved GPUs of the trainer node (also the coordinator)."""
    gpus_per_node: int = 8
    iterations: int = 100
    """Training iterations (one more validates the last weights, as `spotlight run` does)."""
    prompts_per_iteration: int = 32
    group_size: int = 16
    """Flow-GRPO's Qwen-Image group size (the Flow-GRPO paper's setting)."""
    commit_every: int = _KNOBS.commit_every
    lease_s: float = _KNOBS.lease_s
    """Queue lease, renewed every lease_s / 2 while working (the real default, the config tree's workers.lease_s)."""
    validate_every: int = 5
    explore_speedup: float = 1.0
    """Training progress of an iteration on explored seeds, in iterations on random seeds (1: no gain measured)."""
    keep_factor: float = 1.0
    """Rollout seeds per explored prompt as a multiple of the group size (W/G): the pre-filter samples W seeds on
    the critical path and trains the G of largest reward variance, so its rollout costs W/G of random seeds'."""
    seed: int = 0

    def __post_init__(self) -> None:
        for name in (
            "num_spot_gpus",
            "num_trainer_gpus",
            "gpus_per_node",
            "iterations",
            "prompts_per_iteration",
            "group_size",
            "commit_every",
            "validate_every",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"SimConfig.{name} must be an int >= 1, got {value!r}")
        if not self.keep_factor >= 1:
            raise ValueError(f"SimConfig.keep_factor must be >= 1 (W seeds kept of G trained), got {self.keep_factor}")
        if not self.lease_s > 0 or not self.explore_speedup > 0:
            raise ValueError(
                f"SimConfig.lease_s and explore_speedup must be > 0, got {self.lease_s}, {self.explore_speedup}"
            )

    @property
    def samples_per_iteration(self) -> int:
        return self.prompts_per_iteration * self.group_size

    def with_policy(self, name: str) -> "SimConfig":
        return replace(self, policy=get_policy(name))


def get_policy(name: str) -> SchedulingPolicy:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from {sorted(POLICIES)}")
    return POLICIES[name]
