"""Work one leased rollout request to the end, or to the point where the worker must stop.

The step loop: resume from the request's committed in-flight state (or start from its
initial noise when none reads back intact: workers/rollout/resume.py), sample one
denoising step at a time, commit the state under this attempt's own key every
`commit_every` steps, and when asked to stop (a preemption notice) commit at once and
return. A finished request's result is committed exclusively under its request id, so a
duplicate from a worker whose lease had expired loses harmlessly. The queue stays with
the caller: this module returns what happened and the caller acks or releases.

Example:
    outcome = work_request(lease.request, lease.attempts, store, holder, worker_id="w0",
                           commit_every=2, should_stop=stop.is_set, lease_lost=lambda: keeper.lost)
    if outcome.status in ("done", "already_done"): queue.ack(lease, outcome.result_key)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from resources.keys import rollout_key, rollout_state_key, run_rewards_key
from resources.queue.records import Request
from resources.store.base import ObjectNotFoundError, TensorStore
from workers.algo.sampler import denoise_step, sample_shape, sampler_sigmas
from workers.rollout.kernels import MIXED_KERNELS_ATOL, kernel_labels, kernel_sets_of, trajectory_drift
from workers.rollout.resume import attempt_state_key, committed_states, resume_or_start
from workers.rollout.state import InFlight, RolloutSpec, result_commit
from workers.rollout.weights import PolicyHolder
from workers.task.prompt_row import fields_negative, set_row_negatives
from workers.task.render import decode_images
from workers.task.rewards import check_per_request_reward, get_reward, score_with_components

Report = Callable[..., None]


def _no_report(event: str, **fields: Any) -> None:
    return None


@dataclass
class RequestOutcome:
    """What one attempt at a request did."""

    request_id: str
    status: str
    """done, already_done (a result was committed earlier), preempted (stopped and committed), lost (lease gone)."""
    resumed_from_step: int
    step: int
    """Steps completed when the attempt ended."""
    committed_step: int
    """Step of the last committed state (the result counts as committed)."""
    result_key: str | None = None
    result_hash: str | None = None
    won: bool = True
    """False when another attempt had already committed the result."""
    compute_s: float = 0.0
    """Seconds spent in denoising steps in this attempt."""
    commit_s: list[float] = field(default_factory=list)
    """Duration of each state commit in this attempt."""


@dataclass
class StepHooks:
    """Callbacks the step loop consults; defaults never stop."""

    should_stop: Callable[[], bool] = lambda: False
    """True once a preemption notice arrived: commit now and return."""
    lease_lost: Callable[[], bool] = lambda: False
    """True once the queue gave the request to another worker: drop it without committing."""
    report: Report = _no_report
    """Progress events (claim, step, commit, done, ...) as keyword fields."""
    step_delay_s: float = 0.0
    """Extra seconds per step: simulates a slower device in local experiments."""
    after_step: Callable[[InFlight], None] | None = None
    """Called after each step (benchmarks raise here to simulate a kill without notice)."""


REMOTE_MARKERS = ("http://", "https://")


def check_run_reward(store: TensorStore, run: str, reward: str) -> None:
    """ValueError unless `reward` is one the run's coordinator named in the store (run_rewards_key). Whoever can
    write to the queue can put any reward in a request, an http:// URL among them, which would send this worker's
    images and its reward token there; the store is written only by the run. Without that list (a run started
    before the coordinator wrote it) a remote reward is refused and a registry name allowed."""
    import json

    try:
        named = json.loads(store.get_bytes(run_rewards_key(run)))
    except ObjectNotFoundError:
        named = None
    if named is None:
        if any(marker in reward for marker in REMOTE_MARKERS):
            raise ValueError(
                f"request for run {run!r} names a remote reward, and the run names no rewards in the store "
                f"({run_rewards_key(run)}): refused"
            )
        return
    if reward not in named:
        raise ValueError(
            f"request for run {run!r} names reward {reward[:200]!r}, which is not one of the run's "
            f"({', '.join(map(repr, named))}): refused"
        )


def work_request(
    request: Request,
    attempt: int,
    store: TensorStore,
    holder: PolicyHolder,
    *,
    worker_id: str,
    commit_every: int,
    hooks: StepHooks = StepHooks(),
) -> RequestOutcome:
    """Run one attempt at `request`; ValueError for a malformed payload (before any compute)."""
    if commit_every < 1:
        raise ValueError(f"commit_every must be >= 1, got {commit_every}")
    spec = RolloutSpec.from_payload(request.payload)
    check_run_reward(store, spec.run, spec.reward)
    check_per_request_reward(spec.reward, "a rollout worker")  # a z-scored multi-reward: refused before compute
    rid = request.request_id
    result_keys = [rollout_key(spec.run, request.iteration, sid) for sid in (spec.sample_ids or (rid,))]
    result_key = result_keys[0]
    committed = [store.read_manifest(key) for key in result_keys]
    done = committed[0] if all(m is not None for m in committed) else None
    if done is not None:  # every sample's result (a batch's samples are committed one by one)
        if committed_states(store, spec.run, rid):  # left by a holder whose lease had expired
            store.delete_commit(rollout_state_key(spec.run, rid))
        step = spec.sampler.num_steps
        return RequestOutcome(
            rid, "already_done", step, step, step, result_key, done.metadata.get("result_hash"), False
        )

    policy = holder.policy_for(spec)  # ValueError for a resolution or guidance it cannot serve
    flight = resume_or_start(store, spec, rid, sample_shape(policy), hooks.report)
    step = _Stepper(policy, spec)
    state_key = attempt_state_key(spec.run, rid, attempt)
    me = {"worker_id": worker_id, "attempt": attempt, "resumed_from_step": flight.step, **_labels(policy, step)}
    outcome = RequestOutcome(rid, "running", flight.step, flight.step, flight.step, result_key)
    hooks.report("claim", request_id=rid, attempt=attempt, resumed_from_step=flight.step)
    while not flight.done:
        if hooks.lease_lost():
            outcome.status = "lost"
            hooks.report("lost", request_id=rid, step=flight.step)
            return outcome
        if hooks.should_stop():
            _commit(store, state_key, flight, me, outcome, hooks)
            outcome.status = "preempted"
            hooks.report("preempted", request_id=rid, step=flight.step, committed_step=outcome.committed_step)
            return outcome
        step_s = step.advance(flight, hooks.step_delay_s)
        outcome.step, outcome.compute_s = flight.step, outcome.compute_s + step_s
        hooks.report("step", request_id=rid, step=flight.step, step_s=step_s)
        if hooks.after_step is not None:
            hooks.after_step(flight)
        if not flight.done and flight.step % commit_every == 0:
            _commit(store, state_key, flight, me, outcome, hooks)
    _publish_result(store, policy, flight, me, outcome, spec, result_keys, hooks)
    return outcome


def _labels(policy, step: "_Stepper") -> dict[str, str]:
    """The device type and kernel set this attempt computes with: an SP group's (its members', who run the
    forwards), else this process's on the policy's device."""
    own = getattr(policy, "kernel_labels", None)
    return dict(own) if own is not None else kernel_labels(step.device)


class _Stepper:
    """One attempt's denoising steps: the prompt encoded and the sigmas made once, then one step at a time
    (no re-encoding and no trajectory re-allocation per step). The state stays where it is committed from."""

    def __init__(self, policy, spec: RolloutSpec):
        self.policy, self.spec = policy, spec
        set_row_negatives(policy, fields_negative(spec.prompt, spec.prompt_fields))
        self.device = next(policy.parameters()).device
        self.cond = policy.encode_prompts([spec.prompt] * len(spec.seeds))
        self.sigmas = sampler_sigmas(policy, spec.sampler).to(self.device)

    def advance(self, flight: InFlight, delay_s: float) -> float:
        """One denoising step in place; returns its seconds (the simulated delay included)."""
        started = time.perf_counter()
        t = flight.step
        x, lp = denoise_step(
            self.policy,
            flight.latents[t].to(self.device),
            t,
            list(self.spec.seeds),
            self.spec.sampler,
            self.cond,
            self.sigmas,
        )
        flight.latents[t + 1] = x.cpu()
        if lp is not None:
            flight.log_probs[t] = lp.cpu()
        flight.step = t + 1
        if delay_s > 0:
            time.sleep(delay_s)
        return time.perf_counter() - started


def _commit(
    store: TensorStore, key: str, flight: InFlight, me: dict, outcome: RequestOutcome, hooks: StepHooks
) -> None:
    if flight.step <= outcome.committed_step:
        return  # nothing new since the last commit (or since the state this attempt resumed from)
    started = time.perf_counter()
    tensors, meta = flight.to_commit()
    meta["attempts"] = meta["attempts"] + [{**me, "committed_step": flight.step}]
    store.publish_tensors(key, tensors, meta)
    seconds = time.perf_counter() - started
    outcome.committed_step = flight.step
    outcome.commit_s.append(seconds)
    hooks.report("commit", request_id=outcome.request_id, step=flight.step, commit_s=seconds)


def _publish_result(
    store: TensorStore,
    policy,
    flight: InFlight,
    me: dict,
    outcome: RequestOutcome,
    spec: RolloutSpec,
    result_keys: list[str],
    hooks: StepHooks,
) -> None:
    """Score every sample and commit each one's result exclusively under its own key (one key for a request
    of one sample); then drop the request's in-flight state."""
    batch = len(spec.seeds)
    images_u8 = decode_images(policy, flight.latents[flight.step])  # (B, H, W, 3); a family's VAE decodes latents
    fields = None if spec.prompt_fields is None else [spec.prompt_fields] * batch
    totals, parts = score_with_components(get_reward(spec.reward), images_u8, [spec.prompt] * batch, fields)
    rewards = [float(r) for r in totals]
    import torch

    attempts = flight.attempts + [{**me, "committed_step": flight.step}]
    kernel_sets = kernel_sets_of(attempts)
    info = {
        **me,
        "steps_done": flight.step - outcome.resumed_from_step,
        "compute_s": outcome.compute_s / batch,
        "attempts": attempts,
        "finished_at": time.time(),
        "kernel_sets": kernel_sets,
        "mixed_kernels": len(kernel_sets) > 1,
    }
    hashes, won = [], []
    for n, key in enumerate(result_keys):
        tensors, meta = result_commit(
            flight,
            torch.from_numpy(images_u8[n]),
            rewards[n],
            info,
            sample=n,
            components={name: float(values[n]) for name, values in parts.items()},
        )
        published = store.publish_tensors(key, tensors, meta, exclusive=True)
        committed = published.manifest.metadata.get("result_hash")
        hashes.append(committed)
        won.append(published.won)
        if not published.won and committed != meta["result_hash"]:
            _check_duplicate(store, key, published.manifest.metadata, tensors, meta, outcome, hooks)
    store.delete_commit(rollout_state_key(spec.run, outcome.request_id))  # every attempt's state
    outcome.status, outcome.committed_step = "done", flight.step
    outcome.won = won[0]
    outcome.result_hash = hashes[0]
    fields = (
        {"result_hash": hashes[0], "reward": rewards[0]}
        if batch == 1
        else {"result_hashes": hashes, "rewards": rewards}
    )
    hooks.report(
        "done",
        request_id=outcome.request_id,
        result_key=outcome.result_key,
        won=won[0],
        steps_done=flight.step - outcome.resumed_from_step,
        compute_s=outcome.compute_s,
        **fields,
    )


def _check_duplicate(
    store: TensorStore, key: str, theirs: dict, tensors: dict, ours: dict, outcome: RequestOutcome, hooks: StepHooks
) -> None:
    """Another attempt committed this result with another hash: check it against the contract that applies
    (docs/SPOT_RUNTIME.md). On one kernel set the bits must be equal, so any difference breaks determinism
    (`hash_mismatch`); across kernel sets the trajectories must agree within MIXED_KERNELS_ATOL (`kernel_drift`,
    or `hash_mismatch` beyond it)."""
    fields = {"request_id": outcome.request_id, "result_key": key, "committed": theirs.get("result_hash")}
    sets = (theirs.get("kernel_sets"), ours["kernel_sets"])
    if sets[0] is not None and (len(sets[0]) != 1 or sets[0] != sets[1]):
        drift = trajectory_drift(store.load_tensors(key), tensors)
        if drift <= MIXED_KERNELS_ATOL:
            hooks.report("kernel_drift", **fields, ours=ours["result_hash"], drift=drift, kernel_sets=list(sets))
            return
        fields["drift"] = drift
    # Determinism is what resumption relies on: say loudly when it breaks.
    hooks.report("hash_mismatch", **fields, ours=ours["result_hash"])
