"""The exploration planner: a UCB bandit over exploration arms, constrained by a time budget.

An arm is one way to explore the next iteration's seeds: M candidate seeds per prompt
sampled at one cheap-sampler level (cache hooks and/or fewer steps, `workers/explore/request.py`),
and W, the seeds per prompt the plan keeps for the rollout: W = G makes exploration the final
pick; W > G makes it a pre-filter (the rollout samples the W on the fresh weights and the train
phase keeps the G of largest real reward variance, at W / G times the rollout's cost).
For every arm the bandit learns two things from what happened:

- its **time cost**: worker-seconds per explored prompt (`observe_time`);
- its **gain**: the reward variance of the planned groups in the real rollout over that of
  random seeds (`observe_gain`, one observation per iteration whose plan it made). The
  baseline is what the run gets without exploration: with a wider draw on, the variance of
  the max-variance subset the trainer keeps of it (`workers/explore/state.py` review_rollout).

`choose` returns the arm with the best upper confidence bound among those whose predicted
exploration time fits the budget (the predicted training time, `predict_budget_s`):

    ucb(a) = mean_gain(a) + c * sqrt(ln(1 + n_total) / n(a))        (UCB1; untried arms: +inf)
    predicted_s(a) = seconds_per_prompt(a) * num_prompts / num_workers <= safety * budget_s
    dropped(a): the arm's mean measured rank fidelity (Kendall tau of its explored against the
                real rewards) is below `min_arm_tau` after `min_tau_observations` measurements

`safety` applies only where costs are estimates: with `unit_cost` given (a budget counted in
exactly known samples) an arm fits when its cost is at most the budget.

An arm never timed is predicted from the cost per unit of work of the arms that were
(work = M x the cache level's nominal cost), so the first choices already respect the
budget; with no timing or no budget yet the bandit takes the cheapest arm. The state is a
plain dict (`to_dict` / `from_dict`) that the coordinator keeps in the tensor store, so a
resumed run continues it. Constants and why: docs/EXPLORATION.md.

Example:
    bandit = UCBBandit([Arm(16, "half_steps"), Arm(24, "fbcache")], BanditConfig())
    choice = bandit.choose(budget_s=20.0, num_prompts=8, num_workers=2)
    bandit.observe_time(choice.arm, seconds=9.1, num_prompts=8)
    bandit.observe_gain(choice.arm, 1.8)           # one iteration later, from the real rollout
    state = bandit.to_dict()                       # JSON; UCBBandit.from_dict(state) continues it
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Arm:
    """One exploration configuration."""

    seeds_per_prompt: int
    """M: candidate seeds sampled per prompt (>= the group size, so a plan can be chosen)."""
    cache_level: str
    """Name of the cheap-sampler level (workers/explore/request.py CACHE_LEVELS)."""
    keep: int | None = None
    """W: seeds per prompt the plan keeps for the rollout (2 <= W <= M); None = the group size G (the plan is
    the final pick). W > G: the rollout samples the W on the fresh weights and the train phase keeps G."""

    def __post_init__(self) -> None:
        if (
            isinstance(self.seeds_per_prompt, bool)
            or not isinstance(self.seeds_per_prompt, int)
            or self.seeds_per_prompt < 2
        ):
            raise ValueError(f"Arm.seeds_per_prompt must be an int >= 2, got {self.seeds_per_prompt!r}")
        if not self.cache_level or "-" in self.cache_level:
            raise ValueError(f"Arm.cache_level must be a non-empty name without '-', got {self.cache_level!r}")
        if self.keep is not None and (
            isinstance(self.keep, bool) or not isinstance(self.keep, int) or not 2 <= self.keep <= self.seeds_per_prompt
        ):
            raise ValueError(
                f"Arm.keep must be None or an int in [2, seeds_per_prompt={self.seeds_per_prompt}], got {self.keep!r}"
            )

    @property
    def name(self) -> str:
        """`m16-half_steps`, or `m32-half_steps-w12` for a pre-filter: how the ledger and the plans name the arm."""
        base = f"m{self.seeds_per_prompt}-{self.cache_level}"
        return base if self.keep is None else f"{base}-w{self.keep}"

    def kept(self, group_size: int) -> int:
        """Seeds per prompt the rollout samples: W, or G when the arm keeps no more than the group."""
        return group_size if self.keep is None else max(self.keep, group_size)

    @classmethod
    def parse(cls, name: str) -> "Arm":
        parts = name.split("-")
        m, level, keep = parts[0], parts[1] if len(parts) > 1 else "", parts[2] if len(parts) > 2 else None
        if (
            len(parts) > 3
            or not m.startswith("m")
            or not m[1:].isdigit()
            or not level
            or (keep is not None and (not keep.startswith("w") or not keep[1:].isdigit()))
        ):
            raise ValueError(f"arm name {name!r} must look like m16-half_steps or m32-half_steps-w12")
        return cls(int(m[1:]), level, None if keep is None else int(keep[1:]))


@dataclass(frozen=True)
class BanditConfig:
    """Constants of the UCB planner."""

    ucb_c: float = 0.5
    """Exploration weight c, in gain units (variance ratios, typically 1-3 here)."""
    safety: float = 0.9
    """An arm fits when its predicted time is at most safety x budget (time estimates are noisy)."""
    gain_cap: float = 5.0
    """Observed gains are clipped to [0, gain_cap]: a near-zero random baseline must not dominate the mean."""
    time_decay: float = 0.5
    """Weight of a new time observation in an arm's running seconds per prompt (times drift as weights change)."""
    min_arm_tau: float | None = None
    """Fidelity floor: an arm whose mean measured Kendall tau (explored vs real rewards) is below it is dropped;
    None = no floor."""
    min_tau_observations: int = 2
    """Measurements of an arm's tau before the floor can drop it (one iteration's tau is noisy)."""

    def __post_init__(self) -> None:
        if not self.ucb_c >= 0:
            raise ValueError(f"BanditConfig.ucb_c must be >= 0, got {self.ucb_c}")
        if not 0 < self.safety <= 1:
            raise ValueError(f"BanditConfig.safety must lie in (0, 1], got {self.safety}")
        if not self.gain_cap > 0:
            raise ValueError(f"BanditConfig.gain_cap must be > 0, got {self.gain_cap}")
        if not 0 < self.time_decay <= 1:
            raise ValueError(f"BanditConfig.time_decay must lie in (0, 1], got {self.time_decay}")
        if self.min_arm_tau is not None and not -1 <= self.min_arm_tau <= 1:
            raise ValueError(f"BanditConfig.min_arm_tau must be None or lie in [-1, 1], got {self.min_arm_tau}")
        if self.min_tau_observations < 1:
            raise ValueError(f"BanditConfig.min_tau_observations must be >= 1, got {self.min_tau_observations}")


@dataclass
class ArmStats:
    """What the bandit has seen of one arm."""

    pulls: int = 0
    """Gain observations."""
    gain_sum: float = 0.0
    seconds_per_prompt: float | None = None
    """Running (exponentially weighted) worker-seconds per explored prompt; None until timed."""
    timings: int = 0
    tau_sum: float = 0.0
    """Sum of the arm's measured rank fidelities (Kendall tau-b of explored against real rewards)."""
    tau_count: int = 0

    @property
    def mean_gain(self) -> float | None:
        return self.gain_sum / self.pulls if self.pulls else None

    @property
    def mean_tau(self) -> float | None:
        return self.tau_sum / self.tau_count if self.tau_count else None


@dataclass(frozen=True)
class Choice:
    """The arm to explore with, and why."""

    arm: Arm | None
    """None when no arm fits the budget: the plan keeps random seeds."""
    ucb: float | None
    """Upper bound of the chosen arm (inf for an untried one)."""
    predicted_s: float | None
    """Predicted exploration wall time (None when nothing has been timed yet)."""
    reason: str
    """One line for the ledger and the asset metadata."""


@dataclass
class UCBBandit:
    arms: list[Arm]
    config: BanditConfig = field(default_factory=BanditConfig)
    cost_weights: dict[str, float] = field(default_factory=dict)
    """cache level -> nominal cost of one sample relative to the full sampler (a prior for untimed arms)."""
    stats: dict[str, ArmStats] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.arms:
            raise ValueError("UCBBandit needs at least one arm")
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"UCBBandit arms must be distinct, got {names}")
        for name in names:
            self.stats.setdefault(name, ArmStats())

    def work_units(self, arm: Arm) -> float:
        """Work of exploring one prompt with `arm`, in full-sampler samples."""
        return arm.seeds_per_prompt * self.cost_weights.get(arm.cache_level, 1.0)

    def seconds_per_prompt(self, arm: Arm, unit_cost: float | None = None) -> float | None:
        """The arm's own timing, else the cost of a unit of work (`unit_cost` when known in advance, else the timed
        arms' seconds per unit) times its work; None if nothing is known."""
        own = self.stats[arm.name].seconds_per_prompt
        if own is not None:
            return own
        if unit_cost is not None:
            return unit_cost * self.work_units(arm)
        timed = [
            (self.stats[a.name].seconds_per_prompt, self.work_units(a))
            for a in self.arms
            if self.stats[a.name].seconds_per_prompt is not None
        ]
        if not timed:
            return None
        per_unit = sum(s for s, _ in timed) / sum(u for _, u in timed)
        return per_unit * self.work_units(arm)

    def predicted_s(self, arm: Arm, num_prompts: int, num_workers: int, unit_cost: float | None = None) -> float | None:
        per_prompt = self.seconds_per_prompt(arm, unit_cost)
        return None if per_prompt is None else per_prompt * num_prompts / num_workers

    def ucb(self, arm: Arm) -> float:
        s = self.stats[arm.name]
        if s.pulls == 0:
            return math.inf
        total = sum(st.pulls for st in self.stats.values())
        return s.mean_gain + self.config.ucb_c * math.sqrt(math.log(1 + total) / s.pulls)

    def choose(
        self, budget_s: float | None, num_prompts: int, num_workers: int = 1, unit_cost: float | None = None
    ) -> Choice:
        """The feasible arm with the best upper bound (ties: the cheaper, then the listed order). `unit_cost`: the
        cost of one unit of work when it is known in advance (1.0 for a budget counted in samples)."""
        if num_prompts < 1 or num_workers < 1:
            raise ValueError(f"num_prompts and num_workers must be >= 1, got {num_prompts}, {num_workers}")
        if budget_s is not None and not budget_s >= 0:
            raise ValueError(f"budget_s must be >= 0 or None, got {budget_s}")
        arms = [a for a in self.arms if not self.dropped(a)]
        if not arms:
            return Choice(
                None, None, None, f"every arm ranks below the fidelity floor {self.config.min_arm_tau}: random seeds"
            )
        predicted = {a.name: self.predicted_s(a, num_prompts, num_workers, unit_cost) for a in arms}
        if budget_s is None or all(p is None for p in predicted.values()):
            arm = min(arms, key=self.work_units)
            why = "no training time measured yet" if budget_s is None else "nothing timed yet"
            return Choice(arm, self.ucb(arm), predicted[arm.name], f"{why}: the cheapest arm, to learn the cost")
        safety = 1.0 if unit_cost is not None else self.config.safety  # exact costs need no margin
        feasible = [a for a in arms if predicted[a.name] <= safety * budget_s * (1 + 1e-9)]
        if not feasible:
            cheapest = min(predicted.values())
            return Choice(
                None,
                None,
                None,
                f"no arm fits the budget ({budget_s:.1f} s; the cheapest needs {cheapest:.1f} s): random seeds",
            )
        order = {a.name: i for i, a in enumerate(self.arms)}
        arm = max(feasible, key=lambda a: (self.ucb(a), -self.work_units(a), -order[a.name]))
        ucb = self.ucb(arm)
        why = "untried arm" if math.isinf(ucb) else f"best upper bound {ucb:.3f}"
        dropped = len(self.arms) - len(arms)
        note = f" ({dropped} below the fidelity floor)" if dropped else ""
        return Choice(
            arm, ucb, predicted[arm.name], f"{why} among {len(feasible)} of {len(self.arms)} arms that fit{note}"
        )

    def dropped(self, arm: Arm) -> bool:
        """Whether the fidelity floor drops the arm: its mean measured tau is below `min_arm_tau`."""
        s, floor = self.stats[arm.name], self.config.min_arm_tau
        return floor is not None and s.tau_count >= self.config.min_tau_observations and s.mean_tau < floor

    def observe_time(self, arm: Arm, seconds: float, num_prompts: int) -> None:
        """Worker-seconds spent exploring `num_prompts` prompts with `arm`."""
        if num_prompts < 1 or not seconds >= 0:
            raise ValueError(f"observe_time needs num_prompts >= 1 and seconds >= 0, got {num_prompts}, {seconds}")
        s = self.stats[self._known(arm)]
        value = seconds / num_prompts
        w = self.config.time_decay
        s.seconds_per_prompt = value if s.seconds_per_prompt is None else (1 - w) * s.seconds_per_prompt + w * value
        s.timings += 1

    def observe_gain(self, arm: Arm, gain: float) -> None:
        """One realised gain of a plan `arm` made (clipped to [0, gain_cap])."""
        if not math.isfinite(gain):
            raise ValueError(f"gain must be finite, got {gain}")
        s = self.stats[self._known(arm)]
        s.pulls += 1
        s.gain_sum += min(max(gain, 0.0), self.config.gain_cap)

    def observe_tau(self, arm: Arm, tau: float) -> None:
        """One measured rank fidelity of `arm`: Kendall tau-b of its explored (stale, cheap) rewards against the
        rollout's real rewards of the same seeds."""
        if not -1 - 1e-9 <= tau <= 1 + 1e-9:
            raise ValueError(f"tau must lie in [-1, 1], got {tau}")
        s = self.stats[self._known(arm)]
        s.tau_sum += float(tau)
        s.tau_count += 1

    def _known(self, arm: Arm) -> str:
        if arm.name not in self.stats:
            raise ValueError(f"arm {arm.name} is not one of this bandit's arms {[a.name for a in self.arms]}")
        return arm.name

    def to_dict(self) -> dict:
        return {
            "arms": [a.name for a in self.arms],
            "config": asdict(self.config),
            "cost_weights": dict(self.cost_weights),
            "stats": {name: asdict(s) for name, s in self.stats.items()},
        }

    @classmethod
    def from_dict(cls, state: dict) -> "UCBBandit":
        arms = [Arm.parse(n) for n in state["arms"]]
        stats = {name: ArmStats(**s) for name, s in state.get("stats", {}).items()}
        return cls(arms, BanditConfig(**state.get("config", {})), dict(state.get("cost_weights", {})), stats)


def predict_budget_s(train_s_history: list[float], window: int = 3) -> float | None:
    """The next training phase's predicted seconds: the median of the last `window` ones (None without history).
    A median, not a mean: one slow iteration (a checkpoint write, a noisy neighbour) should not move the budget."""
    recent = [s for s in train_s_history if math.isfinite(s) and s >= 0][-window:]
    if not recent:
        return None
    ordered = sorted(recent)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
