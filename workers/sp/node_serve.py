"""`python -m workers.sp`: a node agent serving rollout requests from the queue on its SP groups.

    python -m workers.sp --queue /runs/demo/queue.db --store /runs/demo/store --workers 8 --device cuda

The node's device workers (one per device) form Ulysses groups, and each group samples one request at a time
with the rollout worker's own request code (workers/sp/node_requests.py). So requests of any run in the store,
the pixel policy's or a diffusers family's rebuilt from the PULSE anchor's spec (Qwen-Image and FLUX.1 at any
degree that divides them, SD3/3.5 at degree 1 only), are committed exactly as `python -m workers.rollout` commits
them. Each round claims at most one request per live worker, picks the SP degree for that backlog
(workers/sp/degree.py, or `--degree`), re-forms the groups when it changes and serves the round; exploration
requests run one per worker at degree 1 (workers/sp/node_explore.py). A lost worker re-forms the survivors and its
request resumes from its last commit; SIGTERM (or a cloud's preemption notice, `--preemption-notice`) commits every
in-flight request, gives it back and exits with `--notice-exit-code`. Progress goes to stdout as the rollout worker's
JSON Lines events (ready with the node's price labels, claim, step, commit, done, acked, failed, ..., exit), which
`python -m resources.cluster.worker_events` relays to the ledger as a rollout worker's, plus formed and group_lost.
"""

from __future__ import annotations

import argparse
import os
import threading
import time

from resources.queue.base import QueueUnavailableError
from resources.settings.config import RunConfig, TrainSection
from workers.rollout.config import KNOBS, add_config_flag, check_knobs, parse_worker_args
from workers.rollout.worker import EventLog, add_cloud_flags, add_knob_flags, check_model_folder, run_process

NODE_KNOBS = ("commit_every", "lease_s", "poll_s")
"""The WorkersSection knobs the node agent reads (its flags of the same name)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workers.sp", description=__doc__.split("\n")[0])
    p.add_argument(
        "--queue", required=True, help="Queue URL: a SQLite file, sqlite:///abs/path.db or redis://host:port/db."
    )
    p.add_argument("--store", required=True, help="Tensor store: a folder, file:///abs/path or s3://bucket/prefix.")
    p.add_argument(
        "--workers", type=int, default=2, help="Device workers on this node (one per GPU with --device cuda)."
    )
    p.add_argument(
        "--device", default=TrainSection().device, choices=("cpu", "cuda"), help="Where the workers run the model."
    )
    p.add_argument(
        "--degree",
        type=_degree,
        default=None,
        help="Groups of this many workers (fewer when fewer are left); auto (default): per round, by the "
        "degree policy.",
    )
    p.add_argument(
        "--model",
        default=None,
        help="The diffusers pipeline folder the runs train (absolute), as python -m workers.rollout takes it: "
        "checked at start, and a run on another folder stops the node (exit 2).",
    )
    p.add_argument("--node-id", default=None, help="This node's name in events and records (default: HOST-PID).")
    add_config_flag(p)
    add_knob_flags(p)
    p.add_argument(
        "--max-idle-s", type=float, default=None, help="Exit after this long without work (default: until SIGTERM)."
    )
    p.add_argument("--max-requests", type=int, default=None, help="Exit after claiming this many requests.")
    p.add_argument(
        "--reply-timeout-s",
        type=float,
        default=600.0,
        help="Longest wait for a worker's answer (a first model load included); a silent worker is killed.",
    )
    p.add_argument(
        "--threads-per-worker", type=int, default=KNOBS.worker_threads, help="torch CPU threads of each device worker."
    )
    p.add_argument("--step-delay-s", type=float, default=0.0, help="Extra seconds per step: simulates a slower device.")
    add_cloud_flags(p, priced="the whole node (all its GPUs)")
    return p


def _degree(text: str) -> int | None:
    """--degree: a positive integer, or auto (None: the degree policy)."""
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 or auto, got {text!r}") from None


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the flag, before anything is opened or started."""
    check_knobs({name: getattr(args, name) for name in NODE_KNOBS})
    for flag, value in (
        ("--workers", args.workers),
        ("--threads-per-worker", args.threads_per_worker),
    ):
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.degree is not None and not 1 <= args.degree <= args.workers:
        raise ValueError(f"--degree must lie in 1..--workers ({args.workers}), got {args.degree}")
    if not args.reply_timeout_s > 0:
        raise ValueError(f"--reply-timeout-s must be > 0, got {args.reply_timeout_s}")
    if args.step_delay_s < 0 or (args.max_idle_s is not None and args.max_idle_s < 0):
        raise ValueError("--step-delay-s and --max-idle-s must be >= 0")
    if args.max_requests is not None and args.max_requests < 1:
        raise ValueError(f"--max-requests must be >= 1, got {args.max_requests}")
    if args.usd_per_hour is not None and not args.usd_per_hour >= 0:
        raise ValueError(f"--usd-per-hour must be >= 0, got {args.usd_per_hour}")
    if not args.notice_interval_s > 0 or not 0 <= args.notice_exit_code <= 255:
        raise ValueError("--notice-interval-s must be > 0 and --notice-exit-code in 0-255")
    args.model = args.model or None  # --model "": the pixel policy
    if args.model is not None:
        check_model_folder(args.model)


def main(argv: list[str] | None = None) -> int:
    return run_process(
        parse_worker_args(build_parser(), argv, node_defaults), "workers.sp", "node_id", check_args, serve
    )


def node_defaults(config: RunConfig) -> dict:
    """What the node agent takes from the run's config (`--config`): its knobs, the model, and its device kind."""
    device = "cuda" if config.train.device.startswith("cuda") else "cpu"
    return {
        **{name: getattr(config.workers, name) for name in NODE_KNOBS},
        "model": config.model.model,
        "device": device,
    }


def serve(args: argparse.Namespace, queue, store, stop: threading.Event, report: EventLog) -> str:
    """Run the node until stopped, idle, done or misconfigured; returns why it ended."""
    from workers.rollout.kernels import kernel_labels  # lazy: pulls torch
    from workers.sp.node_agent import AgentConfig, NodeAgent  # lazy: pulls torch
    from workers.sp.node_requests import RequestServer, ServeConfig  # lazy: pulls torch

    config = AgentConfig(
        store_url=store.url,
        device=args.device,
        commit_every=args.commit_every,
        threads_per_worker=args.threads_per_worker,
        reply_timeout_s=args.reply_timeout_s,
        model=args.model,
    )
    with NodeAgent(config) as agent:
        ids = agent.spawn(args.workers)
        # The rollout worker's `ready` and `exit`: the relay and the ledger count the node as one worker at its price,
        # holding `num_gpus` GPUs (priced from the table for that many without --usd-per-hour).
        report(
            "ready",
            pid=os.getpid(),
            commit_every=args.commit_every,
            instance_type=args.instance_type,
            gpu_type=args.gpu_type,
            spot=args.spot,
            usd_per_hour=args.usd_per_hour,
            workers={w: agent.workers[w].proc.pid for w in ids},
            devices={w: agent.workers[w].device for w in ids},
            num_gpus=sum(agent.workers[w].device.startswith("cuda") for w in ids),
            # The members' (their environment is this process's); a group above one adds its degree to each result's.
            **kernel_labels(args.device, threads=args.threads_per_worker),
        )
        server = RequestServer(
            agent,
            queue,
            store,
            report,
            ServeConfig(args.node_id, args.commit_every, args.degree, args.step_delay_s),
            stop,
        )
        reason = _claim_loop(args, agent, queue, server, stop, report)
        reason = "misconfigured" if server.misconfigured else reason
        report("exit", reason=reason, loaded=_loaded_parts(agent))
    return reason


def _claim_loop(args, agent, queue, server, stop: threading.Event, report) -> str:
    claimed, idle_since = 0, time.monotonic()
    while not stop.is_set():
        if args.max_requests is not None and claimed >= args.max_requests:
            return "max_requests"
        agent.forget_dead()
        room = len(agent.live_loaded())
        if args.max_requests is not None:
            room = min(room, args.max_requests - claimed)
        leases = _claim(queue, args.node_id, room, args.lease_s, report)
        if not leases:
            if args.max_idle_s is not None and time.monotonic() - idle_since >= args.max_idle_s:
                return "idle"
            stop.wait(args.poll_s)
            continue
        server.serve(leases)
        claimed += len(leases)
        idle_since = time.monotonic()
    return "stopped"


def _claim(queue, node_id: str, capacity: int, lease_s: float, report) -> list:
    leases = []
    while len(leases) < capacity:
        try:
            lease = queue.claim(node_id, lease_s)
        except QueueUnavailableError as err:
            report("queue_unavailable", error=str(err))
            break
        if lease is None:
            break
        leases.append(lease)
    return leases


def _loaded_parts(agent) -> dict[str, list[str]]:
    """What each live worker loaded besides the transformer (a member fed from the prompt cache: no text encoder)."""
    from workers.sp.group_policy import GroupChannel, GroupLost  # lazy: pulls torch

    agent.forget_dead()
    out = {}
    for wid in agent.live_loaded():
        try:
            out[wid] = GroupChannel([agent.workers[wid]], 60.0).call({"op": "status"})["loaded"]
        except GroupLost:
            continue  # died on the way out
    return out
