"""What exploration remembers between iterations, and the monitor that judges a plan after its rollout.

`ExplorationState` holds the bandit, the training times that set the budget, the reward
variance of random seeds (the baseline a plan's gain is measured against) and the
fallback flag. It is a plain dict in the tensor store (`bandit_state_key`), so a resumed
run continues it; every update is keyed by iteration, so redoing an iteration does not
count it twice.

`review_rollout` runs once the rollout of iteration k (sampled with the plan made during
k-1) is scored: it compares the explored (stale, cheap) rewards of the planned seeds with
their real rewards (Kendall tau-b, Spearman rho, pairwise concordance, per prompt, then
averaged), measures the planned groups' reward variance against random seeds' (the
bandit's gain for the arm that made the plan), and decides whether the next plan falls
back to random seeds: it does while the mean tau is below `min_kendall_tau`.

Every variance is that of the group the trainer actually trains on: with a wider draw
(TrainConfig.rollouts_per_prompt > group_size) a random group is cut to its max-variance
subset (`keep_max_variance`), so the baseline is what the run would get without
exploration, and an explored plan only gains what it adds over the wider draw.

Example:
    state = ExplorationState.new(ExploreConfig(), group_size=8)
    review = review_rollout(state, ExploreConfig(), 5, plan, real_rewards, group_size=8)   # updates state
    review.kendall_tau, review.variance_gain, state.fallback
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from resources.settings.config import RunConfig
from workers.algo.bandit import Arm, BanditConfig, UCBBandit, predict_budget_s
from workers.algo.rank_consistency import kendall_tau_b, mean_over_groups, pairwise_concordance, spearman_rho
from workers.algo.selection import select_max_variance
from workers.explore.request import CACHE_LEVELS, cache_level
from workers.explore.seed_plan import SeedPlan

_TINY_VARIANCE = 1e-9


@dataclass(frozen=True)
class ExploreConfig:
    """How exploration runs: the arms, the fallback threshold, the workers it counts on."""

    seed_multipliers: tuple[int, ...] = (2, 3, 4)
    """Arms' candidate seeds per prompt, as multiples of the group size G (M = 2G, 3G, 4G)."""
    cache_levels: tuple[str, ...] = ("fbcache", "half_steps", "quarter_steps")
    """Arms' cheap-sampler levels (workers/explore/request.py CACHE_LEVELS); every pair with a multiplier is an arm."""
    min_kendall_tau: float = 0.2
    """Below this mean Kendall tau (stale, cheap vs real rewards) the next plan keeps random seeds."""
    baseline_decay: float = 0.5
    """Weight of a new measurement in the running reward variance of random-seed groups."""
    num_workers: int = 1
    """Workers exploring at once: the predicted exploration time is divided by it."""
    keep_factors: tuple[float, ...] = (1.0,)
    """Arms' seeds kept per prompt for the rollout, as multiples of G (W = round(f x G), at most M): 1.0 = the
    plan is the final pick; 1.5 = a pre-filter keeping 1.5 G for the rollout to choose G from on fresh weights."""
    control_prompts: int = 0
    """Prompts per iteration that keep their random seeds (not explored; a different one each iteration): a
    concurrent control, so an arm's gain is measured against random seeds on the same weights."""
    min_contest_std: float = 0.0
    """A prompt whose explored rewards' std is at most this is uncontested: it keeps its G default seeds
    (no pre-filter extras in the rollout), whatever the arm keeps."""
    budget_samples: float | None = None
    """A pool's exploration budget per iteration in full-sampler samples. None: the predicted training time, and
    the plan takes what finished when training ends (a stop on the wall clock: which seeds a run trains on depends
    on the machine's load). Set: the session plans the arm and the requests that fit this budget (costs in samples,
    `UCBBandit.work_units`), records the plan, and the seed plan waits for exactly those requests, so a run seed
    gives the same seed plans whatever the load (what waiting costs shows as the plan's `overhead_s`)."""
    budget_wait_s: float = 600.0
    """With `budget_samples`: the longest the seed plan waits without any planned request finishing (workers that
    make progress are waited for however slow they are; after a stall this long it plans from what finished, and
    the seed plan phase reports how many planned requests were missing)."""
    bandit: BanditConfig = field(default_factory=BanditConfig)

    def __post_init__(self) -> None:
        if not self.seed_multipliers or any(
            isinstance(m, bool) or not isinstance(m, int) or m < 1 for m in self.seed_multipliers
        ):
            raise ValueError(f"ExploreConfig.seed_multipliers must be ints >= 1, got {self.seed_multipliers}")
        if not self.cache_levels:
            raise ValueError("ExploreConfig.cache_levels must name at least one level")
        for name in self.cache_levels:
            cache_level(name)
        if not -1 <= self.min_kendall_tau <= 1:
            raise ValueError(f"ExploreConfig.min_kendall_tau must lie in [-1, 1], got {self.min_kendall_tau}")
        if not 0 < self.baseline_decay <= 1:
            raise ValueError(f"ExploreConfig.baseline_decay must lie in (0, 1], got {self.baseline_decay}")
        if self.num_workers < 1:
            raise ValueError(f"ExploreConfig.num_workers must be >= 1, got {self.num_workers}")
        if not self.keep_factors or any(isinstance(f, bool) or not f >= 1 for f in self.keep_factors):
            raise ValueError(f"ExploreConfig.keep_factors must be numbers >= 1, got {self.keep_factors}")
        if (
            isinstance(self.control_prompts, bool)
            or not isinstance(self.control_prompts, int)
            or self.control_prompts < 0
        ):
            raise ValueError(f"ExploreConfig.control_prompts must be an int >= 0, got {self.control_prompts!r}")
        if not self.min_contest_std >= 0:
            raise ValueError(f"ExploreConfig.min_contest_std must be >= 0, got {self.min_contest_std}")
        if self.budget_samples is not None and not self.budget_samples > 0:
            raise ValueError(f"ExploreConfig.budget_samples must be > 0 or None, got {self.budget_samples}")
        if not self.budget_wait_s > 0:
            raise ValueError(f"ExploreConfig.budget_wait_s must be > 0, got {self.budget_wait_s}")

    def arms(self, group_size: int) -> list[Arm]:
        """Every (M, level, W) with W <= M; W = G is named as before (`m16-half_steps`)."""
        out = []
        for m in self.seed_multipliers:
            for level in self.cache_levels:
                for f in self.keep_factors:
                    keep = round(f * group_size)
                    if keep <= m * group_size:
                        out.append(Arm(m * group_size, level, None if keep == group_size else keep))
        return list(dict.fromkeys(out))

    def controls(self, iteration: int, num_prompts: int) -> list[int]:
        """The control prompts of `iteration`: `control_prompts` indices, rotating over the iterations."""
        n = min(self.control_prompts, num_prompts)
        return sorted({(iteration * n + j) % num_prompts for j in range(n)})

    def new_bandit(self, group_size: int) -> UCBBandit:
        weights = {name: CACHE_LEVELS[name].nominal_cost for name in self.cache_levels}
        return UCBBandit(self.arms(group_size), self.bandit, weights)


def explore_config_of(config: RunConfig) -> ExploreConfig:
    """The exploration settings of a run's `explore` section: its arms (seed multipliers x cache levels); a keep
    factor above 1 explores as a pre-filter (W = keep_factor x G kept for the rollout to pick G from on the fresh
    weights); control prompts stay on their default seeds; arms whose stale-vs-fresh Kendall tau falls below
    min_arm_tau are dropped; with explore_budget_rollouts, a pool's exploration stops on a request budget of that
    many rollouts' worth of samples (prompts x G each), so a run seed is the same run whatever the machine's load,
    else when training ends. The bandit's other settings are ExploreConfig's."""
    e, t = config.explore, config.train
    budget = None
    if e.explore_budget_rollouts is not None:
        budget = e.explore_budget_rollouts * t.prompts_per_iteration * t.group_size
    return ExploreConfig(
        seed_multipliers=e.seed_multipliers,
        cache_levels=e.cache_levels,
        keep_factors=(e.keep_factor,),
        control_prompts=e.control_prompts,
        bandit=BanditConfig(min_arm_tau=e.min_arm_tau),
        budget_samples=budget,
    )


def explore_config_for(preset: str) -> ExploreConfig:
    """Preset `preset`'s exploration settings (explore_config_of its whole config); a context built in code under a
    name of its own (a bench's) explores with ExploreConfig's defaults."""
    from workers.trainer.presets import PRESETS, preset_config

    return explore_config_of(preset_config(preset)) if preset in PRESETS else ExploreConfig()


@dataclass
class ExplorationState:
    bandit: UCBBandit
    train_s: dict[int, float] = field(default_factory=dict)
    """Iteration -> seconds its training phase took (the budget is predicted from these)."""
    random_variance: float | None = None
    """Running mean within-group reward variance of groups sampled with random (default) seeds."""
    last_kendall_tau: float | None = None
    fallback: bool = False
    """True: the next plan keeps random seeds, because stale rankings stopped agreeing with real ones."""
    reviewed: list[int] = field(default_factory=list)
    """Iterations whose rollout the monitor has judged (each counts once)."""
    timed: list[int] = field(default_factory=list)
    """Iterations whose exploration time the bandit has seen."""

    @classmethod
    def new(cls, config: ExploreConfig, group_size: int) -> "ExplorationState":
        return cls(config.new_bandit(group_size))

    def budget_s(self) -> float | None:
        """The predicted training time of the next iteration (None before any was measured)."""
        return predict_budget_s([self.train_s[k] for k in sorted(self.train_s)])

    def record_train_s(self, iteration: int, seconds: float) -> None:
        self.train_s[iteration] = float(seconds)

    def record_time(self, iteration: int, arm: Arm, seconds: float, num_prompts: int) -> None:
        if iteration not in self.timed and num_prompts > 0:
            self.bandit.observe_time(arm, seconds, num_prompts)
            self.timed.append(iteration)

    def to_dict(self) -> dict:
        return {
            "bandit": self.bandit.to_dict(),
            "train_s": {str(k): v for k, v in self.train_s.items()},
            "random_variance": self.random_variance,
            "last_kendall_tau": self.last_kendall_tau,
            "fallback": self.fallback,
            "reviewed": list(self.reviewed),
            "timed": list(self.timed),
        }

    @classmethod
    def from_dict(cls, raw: dict) -> "ExplorationState":
        return cls(
            UCBBandit.from_dict(raw["bandit"]),
            {int(k): float(v) for k, v in raw.get("train_s", {}).items()},
            raw.get("random_variance"),
            raw.get("last_kendall_tau"),
            bool(raw.get("fallback", False)),
            [int(k) for k in raw.get("reviewed", [])],
            [int(k) for k in raw.get("timed", [])],
        )


@dataclass(frozen=True)
class Review:
    """The monitor's verdict on one iteration's plan, measured on its real rollout."""

    iteration: int
    planner: str
    kendall_tau: float | None
    """Mean over explored prompts of tau-b between explored and real rewards of the planned seeds."""
    spearman_rho: float | None
    concordance: float | None
    """Mean pairwise concordance (the ledger's rank_consistency)."""
    planned_variance: float
    """Mean within-group variance of the real rewards of the groups trained on, over all the iteration's prompts."""
    random_variance: float | None
    """The random-seed baseline after this review."""
    variance_gain: float | None
    """planned_variance / random_variance for an explored plan (None otherwise)."""
    fallback: bool
    """Whether the next plan falls back to random seeds."""
    per_prompt_tau: list[float] = field(default_factory=list)
    trained_variance: list[float] = field(default_factory=list)
    """Per prompt: within-group variance of the real rewards of the group trained on
    (the kept subset of a wider draw)."""
    explored_prompts: list[bool] = field(default_factory=list)
    """Per prompt: whether exploration chose its seeds (False: default, i.e. random, seeds)."""

    def as_dict(self) -> dict:
        return asdict(self)


def review_rollout(
    state: ExplorationState,
    config: ExploreConfig,
    iteration: int,
    plan: SeedPlan,
    real_rewards: list[list[float]],
    group_size: int | None = None,
) -> Review:
    """Judge `plan` on the real rewards of its seeds (real_rewards[i][j] for plan.seeds[i][j]); update the state.
    group_size: the size of the groups trained on (a larger group, a wider draw, is cut to its max-variance
    subset as the trainer does); None: every group is trained whole."""
    if len(real_rewards) != len(plan.seeds) or any(
        len(r) != len(s) for r, s in zip(real_rewards, plan.seeds, strict=False)
    ):
        raise ValueError(f"iteration {iteration}: real rewards do not match the plan's seeds")
    explored = plan.explored_rewards or [None] * len(plan.seeds)
    controls = set(plan.control_prompts)
    pairs = [(e, r) for e, r in zip(explored, real_rewards, strict=False) if e is not None]
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    tau = mean_over_groups(kendall_tau_b, xs, ys)
    variances = [trained_variance(r, group_size) for r in real_rewards]
    planned = float(np.mean(variances))
    # Groups that kept their default seeds are random-seed groups: they refresh the baseline.
    is_explored = [plan.explored and e is not None and i not in controls for i, e in enumerate(explored)]
    random_groups = [v for v, x in zip(variances, is_explored, strict=False) if not x]
    first = iteration not in state.reviewed
    if first and random_groups:
        value, w = float(np.mean(random_groups)), config.baseline_decay
        state.random_variance = value if state.random_variance is None else (1 - w) * state.random_variance + w * value
    gain = _gain(planned, state.random_variance, config.bandit.gain_cap) if plan.explored else None
    if first:
        if gain is not None:
            state.bandit.observe_gain(Arm.parse(plan.planner.split(":", 1)[1]), gain)
        if plan.explored and tau is not None:
            state.bandit.observe_tau(Arm.parse(plan.planner.split(":", 1)[1]), tau)
        if tau is not None:
            state.last_kendall_tau = tau
            state.fallback = tau < config.min_kendall_tau
        state.reviewed.append(iteration)
    return Review(
        iteration,
        plan.planner,
        tau,
        mean_over_groups(spearman_rho, xs, ys),
        mean_over_groups(pairwise_concordance, xs, ys),
        planned,
        state.random_variance,
        gain,
        state.fallback,
        [kendall_tau_b(x, y) for x, y in zip(xs, ys, strict=False)],
        variances,
        is_explored,
    )


def trained_variance(rewards: list[float], group_size: int | None) -> float:
    """Reward variance of the group the trainer keeps: the max-variance `group_size` subset of a wider draw
    (`workers.trainer.grpo_trainer.keep_max_variance`), else the whole group."""
    if group_size is None or len(rewards) <= group_size:
        return float(np.var(rewards))
    kept = select_max_variance(list(range(len(rewards))), rewards, group_size)
    return float(np.var([rewards[i] for i in kept]))


def _gain(planned: float, baseline: float | None, cap: float) -> float | None:
    if baseline is None:
        return None
    if baseline < _TINY_VARIANCE:  # random seeds gave no contrast at all: any contrast is the most a plan can add
        return cap if planned >= _TINY_VARIANCE else 1.0
    return min(planned / baseline, cap)


def explored_variance(candidate_rewards: list[list[float]]) -> float | None:
    """Mean within-prompt variance of the explored rewards over all candidates (the ledger's reward_variance)."""
    values = [float(np.var(r)) for r in candidate_rewards if len(r) > 0]
    return float(np.mean(values)) if values else None
