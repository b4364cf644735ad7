"""`spotlight bench preemption`: what a preemption costs with and without state commitment, and pull vs static.

Three measurements, all real runs of the rollout worker's code on this machine:

1. Lost denoising work per preemption. A request is interrupted after step k (every k
   in 1..num_steps-1, several seeds), by a SIGKILL-like abort (no notice) or a notice
   (SIGTERM: commit now), then resumed by a fresh worker. Lost = steps the second
   worker recomputes, and the seconds those steps took the first time. Every resumed
   result is checked bit-identical to an uninterrupted one.
2. Commit overhead: the time of one state commit to a local tensor store (fsync on)
   against one denoising step, per step for commit cadences c.
3. Throughput with workers of uneven speed: a local cluster of worker processes (one
   slowed by a per-step delay) drains the same requests pulling from one shared queue,
   then with a static round-robin assignment (one queue per worker). Worker start-up
   is excluded: the clock starts when every worker is ready.

Example:
    figures = run_preemption_bench(quick=True)       # tiny random policy, a smoke run
"""

from __future__ import annotations

import platform
import statistics
import tempfile
from pathlib import Path
from typing import Any

from resources.queue.records import Request
from resources.store.local import LocalTensorStore
from workers.algo.sampler import SamplerConfig
from workers.rollout.request import StepHooks, work_request
from workers.rollout.state import RolloutSpec, rollout_request
from workers.rollout.weights import PolicyHolder, publish_policy

PROMPTS = [
    "two red circles",
    "a blue square left of a green triangle",
    "three yellow squares",
    "a purple circle on the left",
]


class _Abort(Exception):
    """Raised after a step to stand in for a SIGKILL: whatever was committed stays, the rest is gone."""


def _policy(quick: bool):
    from workers.model.tiny_policy import SHIPPED_BASE, PolicyConfig, build_policy, load_policy

    if quick:
        cfg = PolicyConfig(image_size=16, num_layers=1, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
        return build_policy(cfg, seed=0).eval(), "random tiny policy (16x16, 1 block)"
    return load_policy(SHIPPED_BASE).eval(), "shipped base (2.5M parameters, 32x32, 4 blocks)"


def _spec(i: int, sampler: SamplerConfig) -> RolloutSpec:
    return RolloutSpec("bench", PROMPTS[i % len(PROMPTS)], 500 + i, 0, sampler)


def _interrupted(store, spec: RolloutSpec, rid: str, k: int, commit_every: int, notice: bool) -> dict[str, Any]:
    """Interrupt `spec` after step k, resume it elsewhere; lost steps and seconds."""
    step_s: dict[int, float] = {}

    def record(event: str, **fields: Any) -> None:
        if event == "step":
            step_s[fields["step"]] = fields["step_s"]

    def abort_at_k(flight) -> None:
        if flight.step == k:
            raise _Abort

    checks = {"n": 0}

    def stop_at_k() -> bool:
        checks["n"] += 1
        return checks["n"] > k

    hooks = (
        StepHooks(report=record, should_stop=stop_at_k) if notice else StepHooks(report=record, after_step=abort_at_k)
    )
    request = Request.from_dict(rollout_request(rid, 0, spec))
    try:
        work_request(request, 1, store, PolicyHolder(store), worker_id="first", commit_every=commit_every, hooks=hooks)
    except _Abort:
        pass
    resumed = work_request(request, 2, store, PolicyHolder(store), worker_id="second", commit_every=commit_every)
    lost = k - resumed.resumed_from_step
    return {
        "steps_lost": lost,
        "seconds_lost": sum(step_s[s] for s in range(resumed.resumed_from_step + 1, k + 1)),
        "result_hash": resumed.result_hash,
    }


def lost_work(store, sampler: SamplerConfig, num_seeds: int, cadences: list[int]) -> list[dict[str, Any]]:
    """Mean lost steps / seconds per preemption for each strategy, over kill points and seeds."""
    n = sampler.num_steps
    reference = {}
    for i in range(num_seeds):
        out = work_request(
            Request.from_dict(rollout_request(f"ref{i}", 0, _spec(i, sampler))),
            1,
            store,
            PolicyHolder(store),
            worker_id="ref",
            commit_every=n + 1,
        )
        reference[i] = out.result_hash
    # Without state commitment a notice saves nothing either: the worker has nothing to commit.
    strategies = [("no state commitment (killed, or noticed)", n + 1, False)]
    strategies += [(f"commit every {c} steps, killed (no notice)", c, False) for c in cadences]
    strategies += [(f"commit every {cadences[-1]} steps + commit on notice (SIGTERM)", cadences[-1], True)]
    rows = []
    for s, (name, c, notice) in enumerate(strategies):
        trials = [
            (i, _interrupted(store, _spec(i, sampler), f"s{s}-k{k}-i{i}", k, c, notice))
            for i in range(num_seeds)
            for k in range(1, n)
        ]
        rows.append(
            {
                "strategy": name,
                "commit_every": None if c > n else c,
                "notice": notice,
                "trials": len(trials),
                "steps_lost_mean": statistics.mean(t["steps_lost"] for _, t in trials),
                "steps_lost_max": max(t["steps_lost"] for _, t in trials),
                "seconds_lost_mean": statistics.mean(t["seconds_lost"] for _, t in trials),
                "resumed_results_bit_identical": all(t["result_hash"] == reference[i] for i, t in trials),
            }
        )
    return rows


def commit_overhead(store, sampler: SamplerConfig, cadences: list[int], repeats: int) -> dict[str, Any]:
    """Median step and commit times, and the overhead per step of each cadence."""
    steps, commits, sizes = [], [], []

    def record(event: str, **fields: Any) -> None:
        if event == "step":
            steps.append(fields["step_s"])
        elif event == "commit":
            commits.append(fields["commit_s"])

    for r in range(repeats):
        request = Request.from_dict(rollout_request(f"ovh{r}", 0, _spec(r, sampler)))
        work_request(
            request, 1, store, PolicyHolder(store), worker_id="w", commit_every=1, hooks=StepHooks(report=record)
        )
    for key in store.list_commits("runs/bench/rollouts/"):
        if "/ovh" in key:
            sizes.append(store.read_manifest(key).objects["tensors.safetensors"].size_bytes)
    step_s, commit_s = statistics.median(steps), statistics.median(commits)
    return {
        "step_s_median": step_s,
        "commit_s_median": commit_s,
        "result_bytes": max(sizes) if sizes else None,  # a state commit is at most this
        "per_cadence": [
            {
                "commit_every": c,
                "overhead_s_per_step": commit_s / c,
                "overhead_pct_of_step": 100 * commit_s / c / step_s,
            }
            for c in cadences
        ],
    }


def _drain(
    tmp: Path, store_url: str, sampler: SamplerConfig, delays: list[float], num_requests: int, pull: bool
) -> dict:
    from resources.cluster import ClusterConfig, LocalCluster, WorkerSlot
    from resources.queue import open_queue

    mode = "pull" if pull else "static"
    requests = [rollout_request(f"{mode}{i:03d}", 1, _spec(i, sampler)) for i in range(num_requests)]
    queues = [open_queue(tmp / f"{mode}-{w if not pull else 'shared'}.db") for w in range(len(delays))]
    slots = [
        WorkerSlot(f"w{w}", spot=False, step_delay_s=d, queue_url=None if pull else str(tmp / f"{mode}-{w}.db"))
        for w, d in enumerate(delays)
    ]
    config = ClusterConfig(str(tmp / f"{mode}-shared.db"), store_url, commit_every=2, ready_timeout_s=900)
    with LocalCluster(config, slots) as cluster:
        for i, request in enumerate(requests):  # after every worker is ready: start-up is not timed
            queues[0 if pull else i % len(delays)].put([request])
        summary = cluster.run_until(lambda: all(q.stats().open == 0 for q in queues), timeout_s=1800)
    per_worker: dict[str, int] = {}
    for e in cluster.tracker.events:
        if e["event"] == "acked" and e["first"]:
            per_worker[e["worker_id"]] = per_worker.get(e["worker_id"], 0) + 1
    return {
        "wall_s": summary.wall_s,
        "completed": summary.completed,
        "requests_per_s": num_requests / summary.wall_s,
        "requests_per_worker": per_worker,
    }


def throughput(tmp: Path, store_url: str, sampler: SamplerConfig, delays: list[float], num_requests: int) -> dict:
    pull = _drain(tmp, store_url, sampler, delays, num_requests, pull=True)
    static = _drain(tmp, store_url, sampler, delays, num_requests, pull=False)
    return {
        "step_delay_s_per_worker": delays,
        "requests": num_requests,
        "pull": pull,
        "static": static,
        "pull_speedup": static["wall_s"] / pull["wall_s"],
    }


def run_preemption_bench(
    quick: bool = False, with_throughput: bool = True, slow_step_delay_s: float | None = None
) -> dict[str, Any]:
    """All three measurements; `quick` uses a tiny random policy and fewer trials. `slow_step_delay_s`: the slow
    worker's extra seconds per step in the throughput part (default: 3x the measured step time, at least 0.01 s)."""
    import torch

    torch.set_num_threads(1)  # like each local worker process
    policy, policy_name = _policy(quick)
    sampler = SamplerConfig(num_steps=4 if quick else 8, noise_level=0.7)
    cadences = [1, 2, 4]
    with tempfile.TemporaryDirectory(prefix="spotlight-bench-preemption-") as tmp:
        store = LocalTensorStore(Path(tmp) / "store")
        publish_policy(store, "bench", policy)
        figures: dict[str, Any] = {
            "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            "policy": policy_name,
            "num_steps": sampler.num_steps,
            "forward_dtype": sampler.forward_dtype,
            "quick": quick,
            "lost_work": lost_work(store, sampler, num_seeds=1 if quick else 3, cadences=cadences),
            "commit_overhead": commit_overhead(store, sampler, cadences, repeats=2 if quick else 5),
        }
        if with_throughput:
            base = figures["commit_overhead"]["step_s_median"]
            slow = 3 * max(base, 0.01) if slow_step_delay_s is None else slow_step_delay_s
            delays = [0.0, 0.0, slow]  # by default the third worker is ~4x slower per step
            figures["throughput"] = throughput(Path(tmp), str(store.root), sampler, delays, 12 if quick else 48)
    return figures


def format_preemption_report(figures: dict[str, Any]) -> str:
    """The figures as a few plain-text tables."""
    lines = [
        f"policy: {figures['policy']}, {figures['num_steps']} steps, machine: {figures['machine']}",
        "",
        "lost denoising work per preemption (kill just after step k, k = 1..num_steps-1):",
    ]
    for row in figures["lost_work"]:
        lines.append(
            f"  {row['strategy']:<58} {row['steps_lost_mean']:5.2f} steps  {row['seconds_lost_mean']:7.3f} s  "
            f"(max {row['steps_lost_max']}, bit-identical: {row['resumed_results_bit_identical']})"
        )
    ovh = figures["commit_overhead"]
    lines += [
        "",
        f"one denoising step {ovh['step_s_median'] * 1000:.1f} ms, "
        f"one state commit {ovh['commit_s_median'] * 1000:.1f} ms "
        f"(result {ovh['result_bytes']} bytes):",
    ]
    for row in ovh["per_cadence"]:
        lines.append(
            f"  commit every {row['commit_every']}: {row['overhead_s_per_step'] * 1000:7.1f} ms per step "
            f"({row['overhead_pct_of_step']:.0f} % of a step)"
        )
    if "throughput" in figures:
        tp = figures["throughput"]
        lines += ["", f"{tp['requests']} requests on workers with per-step delays {tp['step_delay_s_per_worker']}:"]
        for mode in ("pull", "static"):
            r = tp[mode]
            lines.append(
                f"  {mode:<7} {r['wall_s']:6.1f} s  {r['requests_per_s']:.2f} requests/s  "
                f"per worker {r['requests_per_worker']}"
            )
        lines.append(f"  pull is {tp['pull_speedup']:.2f}x faster than static assignment")
    return "\n".join(lines)
