"""Typed rows the coordinator records in the run ledger; field names are the column names."""

from __future__ import annotations

import json
import math
import re
import typing
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence
from urllib.parse import urlparse

from resources.settings.base import OnHacking

REQUEST_KINDS = ("rollout", "explore", "validate")
REQUEST_STATUSES = ("done", "failed", "cancelled")
ATTEMPT_OUTCOMES = ("running", "done", "preempted", "lease_expired", "failed", "cancelled")
WORKER_ROLES = ("rollout", "explore", "trainer", "coordinator", "node_agent")
WORKER_END_REASONS = ("finished", "preempted", "failed", "scaled_down", "interrupted")
SYNC_KINDS = ("patch", "anchor", "dense", "ddp", "diloco", "pulseloco")

_SECRET_KEY = re.compile(r"secret|password|passwd|token|credential|access_key|api_key", re.IGNORECASE)

Timestamp = datetime | float | None
"""A datetime (naive = UTC), POSIX seconds (time.time()), or None for now."""


def to_utc(at: Timestamp) -> datetime:
    """Naive UTC datetime for a TIMESTAMP column."""
    if at is None:
        return datetime.now(timezone.utc).replace(tzinfo=None)
    if isinstance(at, (int, float)) and not isinstance(at, bool):
        return datetime.fromtimestamp(float(at), timezone.utc).replace(tzinfo=None)
    if isinstance(at, datetime):
        return at.astimezone(timezone.utc).replace(tzinfo=None) if at.tzinfo else at
    raise ValueError(f"time must be a datetime, POSIX seconds or None, got {at!r}")


def check_choice(value: str, allowed: tuple[str, ...], what: str) -> None:
    if value not in allowed:
        raise ValueError(f"{what} must be one of {allowed}, got {value!r}")


def check_non_negative(record: object, *names: str) -> None:
    for name in names:
        value = getattr(record, name)
        if value is not None and not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{type(record).__name__}.{name} must be a finite number >= 0, got {value!r}")


def check_fraction(record: object, *names: str) -> None:
    check_non_negative(record, *names)
    for name in names:
        value = getattr(record, name)
        if value is not None and value > 1:
            raise ValueError(f"{type(record).__name__}.{name} must lie in [0, 1], got {value!r}")


@dataclass(frozen=True)
class RequestRecord:
    """One finished (or abandoned) request: the unit of work workers pull."""

    request_id: str
    """Queue id; also the result's store key segment."""
    iteration: int
    """Iteration the request belongs to."""
    kind: str
    """rollout, explore or validate."""
    prompt: str
    """Prompt text."""
    seed: int
    """Seed fixing the initial noise and every SDE step's noise."""
    weights_version: int
    """Policy version the request was sampled with."""
    worker_id: str | None
    """Worker that produced the result (None if it never finished)."""
    attempts: int
    """Deliveries it took (1 = no preemption)."""
    status: str = "done"
    """done, failed or cancelled."""
    result_hash: str | None = None
    """xxh3 of the result, for exactly-once and reproducibility checks."""
    reward: float | None = None
    """Reward of the produced image."""
    enqueued_at: Timestamp = None
    """When it was queued."""
    finished_at: Timestamp = None
    """When its result was committed."""
    arm: str | None = None
    """Exploration arm (explore requests only)."""
    reward_components: str | None = None
    """A multi-reward's raw value of each component, a JSON object {name: value} (`components_json`); None for
    a single reward."""
    kernel_sets: str | None = None
    """The kernel sets that computed the result's steps, a JSON list of names (workers/rollout/kernels.py); None
    when the result does not say."""
    mixed_kernels: bool = False
    """Computed on more than one kernel set (resumed on another kind of worker): held to a tolerance, not to an
    uninterrupted run's hash (docs/SPOT_RUNTIME.md)."""

    def __post_init__(self) -> None:
        check_choice(self.kind, REQUEST_KINDS, "RequestRecord.kind")
        check_choice(self.status, REQUEST_STATUSES, "RequestRecord.status")
        if self.attempts < 1:
            raise ValueError(f"RequestRecord.attempts must be >= 1, got {self.attempts}")
        if self.reward is not None and not math.isfinite(self.reward):
            raise ValueError(f"RequestRecord.reward must be finite, got {self.reward}")
        if self.reward_components is not None:
            components_json(json.loads(self.reward_components))  # a JSON object of finite numbers, or ValueError


def components_json(components: Mapping[str, float] | None) -> str | None:
    """A multi-reward's components as the JSON text of `requests.reward_components` (None for none); ValueError
    for a value that is not a finite number."""
    if not components:
        return None
    if not isinstance(components, Mapping):
        raise ValueError(f"reward components must be a JSON object of numbers, got {components!r:.80}")
    bad = sorted(
        str(k)
        for k, v in components.items()
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
    )
    if bad:
        raise ValueError(f"reward components {bad} are not finite numbers")
    return json.dumps({str(k): float(v) for k, v in components.items()}, sort_keys=True)


@dataclass(frozen=True)
class AttemptRecord:
    """One delivery of a request to a worker."""

    request_id: str
    """The request."""
    attempt: int
    """1 for the first delivery."""
    worker_id: str
    """Worker that held the lease."""
    started_at: Timestamp
    """Lease start."""
    ended_at: Timestamp
    """Lease end (None while running)."""
    outcome: str
    """running, done, preempted, lease_expired, failed or cancelled."""
    resumed_from_step: int = 0
    """Denoising step the attempt resumed from (0 = from scratch)."""
    steps_done: int | None = None
    """Denoising steps this attempt computed."""
    steps_lost: int | None = None
    """Of those, the steps not committed when it ended (recomputed by the next attempt); None while running."""
    seconds_lost: float | None = None
    """Compute time of the lost steps."""

    def __post_init__(self) -> None:
        check_choice(self.outcome, ATTEMPT_OUTCOMES, "AttemptRecord.outcome")
        check_non_negative(self, "resumed_from_step", "steps_done", "steps_lost", "seconds_lost")
        if self.attempt < 1:
            raise ValueError(f"AttemptRecord.attempt must be >= 1, got {self.attempt}")


@dataclass(frozen=True)
class PreemptionRecord:
    """A spot worker taken away."""

    worker_id: str
    """The preempted worker."""
    preempted_at: Timestamp
    """When the notice (or the kill) arrived."""
    notice_s: float
    """Seconds of notice given; 0 = none (SIGKILL)."""
    steps_lost: int
    """Denoising steps that must be recomputed."""
    state_committed: bool
    """Whether in-flight state was committed before the worker died."""
    request_id: str | None = None
    """Request in flight, if any; None when several were (an SP node's groups: each attempt row has its own loss)."""
    seconds_lost: float | None = None
    """Compute time of the lost steps."""

    def __post_init__(self) -> None:
        check_non_negative(self, "notice_s", "steps_lost", "seconds_lost")


@dataclass(frozen=True)
class SyncRecord:
    """One weights publication (a PULSE patch, a full anchor, a dense copy), or one
    multi-trainer round's payload from one replica (ddp, diloco, pulseloco)."""

    version: int
    """Weights version reached."""
    kind: str
    """patch, anchor or dense (weights sync); ddp, diloco or pulseloco (trainer sync)."""
    dense_bytes: int
    """Size of the full BF16 weights (what a dense sync would send); trainer sync: the dense FP32
    exchange of the same round (4 B per parameter, DDP: per local step; docs/PULSELOCO.md)."""
    patch_bytes: int
    """Bytes actually published."""
    iteration: int | None = None
    """Iteration whose sync phase published it."""
    changed_fraction: float | None = None
    """Share of BF16 values that changed since version-1 (trainer sync: share of entries sent)."""
    encode_s: float | None = None
    """Seconds to diff and encode."""
    apply_s: float | None = None
    """Seconds to apply on a worker (including the hash check)."""
    weights_hash: str | None = None
    """xxh3-128 of the weights at `version`."""
    replica: int = 0
    """Sending replica of a multi-trainer round (0 for a weights sync)."""

    def __post_init__(self) -> None:
        check_choice(self.kind, SYNC_KINDS, "SyncRecord.kind")
        check_non_negative(self, "dense_bytes", "patch_bytes", "encode_s", "apply_s", "replica")
        check_fraction(self, "changed_fraction")


@dataclass(frozen=True)
class ExplorationRecord:
    """What exploration did while iteration `iteration` trained (it plans iteration+1)."""

    iteration: int
    """Iteration during whose training exploration ran."""
    arm: str
    """Bandit arm (exploration configuration) chosen."""
    budget_s: float
    """Time budget: the predicted training time."""
    time_used_s: float
    """Time exploration actually took."""
    num_requests: int
    """Exploration requests completed."""
    reward_variance: float | None = None
    """Mean within-prompt reward variance over the explored seeds."""
    rank_consistency: float | None = None
    """Agreement of stale-weight seed ranking with fresh weights (pairwise concordance)."""
    ucb_score: float | None = None
    """UCB value of the chosen arm when it was chosen."""
    seeds_per_prompt: int | None = None
    """Candidate seeds explored per prompt (the arm's M)."""
    cache_level: str | None = None
    """The arm's cheap-sampler setting (cache hook and/or step count)."""
    overhead_s: float | None = None
    """Seconds exploration added to the critical path (0 when it fit beside training)."""
    variance_gain: float | None = None
    """Reward variance of the planned groups in the real rollout over that of random seeds."""
    kendall_tau: float | None = None
    """Kendall tau between stale (explored) and fresh (rollout) rewards of the same seeds."""
    spearman_rho: float | None = None
    """Spearman rho between the same."""
    fallback_random: bool | None = None
    """True when rank consistency was too low and the plan fell back to random seeds."""

    def __post_init__(self) -> None:
        check_non_negative(
            self,
            "budget_s",
            "time_used_s",
            "num_requests",
            "reward_variance",
            "seeds_per_prompt",
            "overhead_s",
            "variance_gain",
        )
        check_fraction(self, "rank_consistency")


@dataclass(frozen=True)
class TrainStepRecord:
    """One optimizer step of GRPO."""

    iteration: int
    """Iteration."""
    step: int
    """Step index within the iteration."""
    loss: float | None = None
    """Policy loss."""
    kl: float | None = None
    """KL to the reference policy."""
    reward_mean: float | None = None
    """Mean reward of the batch."""
    reward_std: float | None = None
    """Mean within-group reward std."""
    zero_std_ratio: float | None = None
    """Share of groups whose rewards are all equal (no learning signal)."""
    clip_fraction: float | None = None
    """Share of ratios clipped."""
    grad_norm: float | None = None
    """Gradient norm before clipping."""
    learning_rate: float | None = None
    """Learning rate used."""
    duration_s: float | None = None
    """Wall time of the step."""

    def __post_init__(self) -> None:
        check_fraction(self, "zero_std_ratio", "clip_fraction")
        check_non_negative(self, "reward_std", "grad_norm", "learning_rate", "duration_s")


def union_seconds(intervals: Sequence[tuple[Any, Any]]) -> float:
    """Length of the union of [start, end) intervals sorted by start."""
    total, current_start, current_end = 0.0, None, None
    for start, end in intervals:
        if current_end is None or start > current_end:
            if current_end is not None:
                total += (current_end - current_start).total_seconds()
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += (current_end - current_start).total_seconds()
    return total


def reject_url_secrets(url: str | None) -> None:
    if url and urlparse(url).password:
        raise ValueError(
            "store/queue URLs recorded in the ledger must not carry credentials; configure them outside the URL"
        )


def reject_config_secrets(config: Mapping[str, Any], where: str) -> None:
    """The ledger is shared and copied around: refuse anything that looks like a credential."""
    for key, value in config.items():
        if _SECRET_KEY.search(str(key)) and value not in (None, "", False):
            raise ValueError(f"{where}.{key} looks like a credential; the ledger must never store credentials")
        if isinstance(value, Mapping):
            reject_config_secrets(value, f"{where}.{key}")


HACKING_ACTIONS: tuple[str, ...] = typing.get_args(OnHacking)
"""What a reward-hacking flag does: the run config's guard.on_hacking choices (resources/settings/base.py)."""


@dataclass(frozen=True)
class HackingSignalsRecord:
    """One validation's reward-hacking signals on the held-out images, and the rule's verdict."""

    iteration: int
    """Validated iteration."""
    weights_version: int
    """Weights version scored."""
    proxy_reward: str
    """The training reward's spec."""
    proxy: float
    """Mean training reward of the held-out images."""
    proxy_se: float
    """Its standard error."""
    gold_reward: str
    """The gold (validation) reward's spec."""
    gold: float
    """Mean gold reward of the held-out images."""
    gold_se: float
    """Its standard error."""
    proxy_components: str | None = None
    """JSON {component: mean} of a multi training reward (None for a single reward)."""
    edge_density: float | None = None
    colour_entropy: float | None = None
    saturation: float | None = None
    compressed_bytes: float | None = None
    diversity: float | None = None
    flagged: bool = False
    """Whether the reward-hacking rule fired."""
    rule: str | None = None
    """Which test fired (proxy_up_gold_down, drift:<statistic>)."""
    detail: str | None = None
    """The numbers behind the verdict."""
    action: str | None = None
    """What the run did on a flag: warn, stop or rollback (None when not flagged)."""
    recorded_at: Timestamp = None

    def __post_init__(self) -> None:
        check_non_negative(
            self, "proxy_se", "gold_se", "edge_density", "colour_entropy", "saturation", "compressed_bytes"
        )
        if self.action is not None:
            check_choice(self.action, HACKING_ACTIONS, "HackingSignalsRecord.action")


@dataclass(frozen=True)
class HackingRollbackRecord:
    """A rollback after a flagged validation: the best-gold weights became the next version."""

    iteration: int
    """The flagged validation's iteration."""
    restored_version: int
    """The weights version restored (best gold so far)."""
    restored_gold: float
    """Its gold score."""
    into_version: int
    """The weights version it was published as (the next one trained from)."""
    learning_rate: float
    """The learning rate training continues with."""
    kl_beta: float
    """The KL coefficient training continues with."""
    recorded_at: Timestamp = None

    def __post_init__(self) -> None:
        check_non_negative(self, "learning_rate", "kl_beta")
