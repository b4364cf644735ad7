"""The rollout worker process: pull requests, sample them resumably, commit results, survive preemption.

    python -m workers.rollout --queue runs/demo/queue.db --store runs/demo/store --config runs/demo/config.yaml

It claims one request at a time from the queue (a batch of one keeps results independent
of what else a worker holds), brings its policy to the request's weights version through
PULSE, samples with per-step log-probs, commits the in-flight state every
`commit_every` steps (the run's config.yaml, `--config`, or `--commit-every`), and on
completion commits the result and acks. SIGTERM (or a cloud preemption notice, see
`--preemption-notice`) commits the state at once, gives the request back to the queue and
exits 0; after a SIGKILL the lease expires and another worker resumes from the last commit.
Progress goes to stdout as JSON Lines (one event per line: ready, claim, step, commit,
done, preempted, lost, failed, exit), which the local cluster reads to keep the ledger.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from resources.queue import open_queue
from resources.queue.base import QueueUnavailableError
from resources.queue.records import check_worker_id
from resources.store import open_store
from resources.store.base import StoreError
from workers.rollout.config import (
    KNOBS,
    RESIDENT_DTYPES,
    WORKER_KNOBS,
    WorkerConfig,
    add_config_flag,
    check_knobs,
    parse_worker_args,
)
from workers.rollout.preemption_notice import NoticeWatcher, notice_checker

EXIT_UNREACHABLE = 2


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m workers.rollout", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--queue", required=True, help="Queue URL: a SQLite file, sqlite:///abs/path.db or redis://host:port/db."
    )
    p.add_argument("--store", required=True, help="Tensor store: a folder, file:///abs/path or s3://bucket/prefix.")
    p.add_argument("--worker-id", default=None, help="Unique worker name (default: HOST-PID).")
    add_config_flag(p)
    add_knob_flags(p)
    p.add_argument("--device", default=WorkerConfig.device, help="torch device for sampling (cpu, cuda, cuda:1).")
    p.add_argument(
        "--model",
        default=None,
        help="The diffusers pipeline folder the run trains (absolute; its PULSE anchor names it): checked at "
        "start, so a node without the weights there stops at once; a run on another folder is refused. "
        "Default: whatever the anchor names.",
    )
    p.add_argument(
        "--resident-dtype",
        choices=RESIDENT_DTYPES,
        default=KNOBS.resident_dtype,
        help="How the worker holds the policy: bf16 (its parameters are the PULSE-patched BF16 weights: a third of "
        "the memory of a BF16 dict beside FP32 parameters, BF16 forwards only), fp32 (FP32 parameters, any forward "
        "dtype). Default auto: bf16 on CUDA, fp32 elsewhere.",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice).")
    p.add_argument(
        "--max-idle-s", type=float, default=None, help="Exit after this long without work (default: run until SIGTERM)."
    )
    p.add_argument(
        "--parent-pid",
        type=int,
        default=None,
        help="Stop as on SIGTERM once this process is no longer the worker's parent: a local cluster's workers end "
        "with the run that started them, even one killed with SIGKILL (default: run until SIGTERM).",
    )
    p.add_argument(
        "--step-delay-s",
        type=float,
        default=WorkerConfig.step_delay_s,
        help="Extra seconds per step: simulates a slower device locally.",
    )
    add_cloud_flags(p, priced="this worker")
    return p


def add_knob_flags(p: argparse.ArgumentParser) -> None:
    """--commit-every, --lease-s and --poll-s: the numeric WorkersSection knobs, with the tree's default and help
    (the SP node agent takes them too)."""
    for name in ("commit_every", "lease_s", "poll_s"):
        info = type(KNOBS).model_fields[name]
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=type(getattr(KNOBS, name)),
            default=getattr(KNOBS, name),
            help=f"{info.description} Default {getattr(KNOBS, name):g} (the run config's workers.{name}).",
        )


def add_cloud_flags(p: argparse.ArgumentParser, priced: str) -> None:
    """The flags of the ledger's price labels and of a spot VM's preemption notice, shared with the SP node agent
    (`priced`: what --usd-per-hour is the price of)."""
    p.add_argument(
        "--instance-type",
        default=None,
        help="Instance label for the ledger, e.g. g5.xlarge (default: SkyPilot's cloud/region, else local-cpu).",
    )
    p.add_argument(
        "--gpu-type",
        default=None,
        help="GPU label for the ledger (e.g. A10G), priced from the table if --usd-per-hour is absent.",
    )
    capacity = p.add_mutually_exclusive_group()
    capacity.add_argument(
        "--spot", dest="spot", action="store_true", default=True, help="Preemptible capacity (default)."
    )
    capacity.add_argument("--reserved", dest="spot", action="store_false", help="On-demand / reserved capacity.")
    p.add_argument("--usd-per-hour", type=float, default=None, help=f"Price of {priced} for the ledger.")
    p.add_argument(
        "--preemption-notice",
        default="off",
        choices=("off", "auto", "aws", "gcp"),
        help="Poll this cloud's metadata server for a preemption notice and treat it as SIGTERM "
        "(auto: the cloud SkyPilot launched this VM on).",
    )
    p.add_argument(
        "--notice-url", default=None, help="Override the metadata URL polled for the notice (tests, proxies)."
    )
    p.add_argument("--notice-interval-s", type=float, default=5.0, help="Seconds between notice polls.")
    p.add_argument(
        "--notice-exit-code",
        type=int,
        default=0,
        help="Exit code after stopping on SIGTERM or a notice (SkyPilot: a code in recover_on_exit_codes).",
    )


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the flag, before anything is opened or imported."""
    check_knobs({name: getattr(args, name) for name in WORKER_KNOBS})
    if not args.notice_interval_s > 0:
        raise ValueError(f"--notice-interval-s must be > 0, got {args.notice_interval_s}")
    if args.usd_per_hour is not None and not args.usd_per_hour >= 0:
        raise ValueError(f"--usd-per-hour must be >= 0, got {args.usd_per_hour}")
    if args.step_delay_s < 0 or (args.max_idle_s is not None and args.max_idle_s < 0):
        raise ValueError("--step-delay-s and --max-idle-s must be >= 0")
    if not 0 <= args.notice_exit_code <= 255:
        raise ValueError(f"--notice-exit-code must lie in 0-255, got {args.notice_exit_code}")
    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    args.model = args.model or None  # --model "": the pixel policy
    if args.model is not None:
        check_model_folder(args.model)

    check_worker_id(args.worker_id)


def check_model_folder(model: str) -> None:
    """ValueError unless `model` is an absolute path holding a diffusers pipeline (its model_index.json)."""
    from pathlib import Path

    if not Path(model).is_absolute():
        raise ValueError(
            f"--model {model!r} must be an absolute path: the run's anchor names its folder that way, "
            "and every node must hold the weights at that same path"
        )
    if not (Path(model) / "model_index.json").is_file():
        raise ValueError(
            f"--model {model} (or the run config's model.model): no diffusers pipeline on this node (no "
            "model_index.json there); mount the weights at that path (SkyPilot file_mounts, e.g. spotlight launch "
            "--model-source s3://bucket/path), or leave model.model unset for the pixel policy"
        )


class EventLog:
    """JSON Lines on stdout, flushed per event so a reader sees them even if we are killed next."""

    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id
        self._lock = threading.Lock()

    def __call__(self, event: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "worker_id": self.worker_id, "event": event, **fields}, default=str)
        with self._lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    return run_process(parse_worker_args(build_parser(), argv), "workers.rollout", "worker_id", check_args, _serve)


def _serve(args: argparse.Namespace, queue, store, stop: threading.Event, report: EventLog) -> str:
    from workers.rollout.loop import WorkerLoop  # lazy: loop pulls torch; the worker CLI parses args first

    reason = WorkerLoop(queue, store, WorkerConfig.from_args(args), stop, report).run()
    report("exit", reason=reason)
    return reason


def run_process(args: argparse.Namespace, who: str, id_flag: str, check, serve) -> int:
    """The process around a serving loop, for the rollout worker and the SP node agent alike: fill in the process's
    name (`args.<id_flag>`, default HOST-PID) and instance label, check the arguments, stop on SIGTERM or SIGINT,
    open the queue and the store, watch for the cloud's preemption notice, and run
    `serve(args, queue, store, stop, report)`. The exit code says why it ended: the notice code when stopped (so
    SkyPilot recovers the job), EXIT_UNREACHABLE when misconfigured or unreachable, else 0."""
    process_id = getattr(args, id_flag) or f"{socket.gethostname().split('.')[0]}-{os.getpid()}"
    setattr(args, id_flag, process_id)
    args.instance_type = args.instance_type or default_instance_type(os.environ.get("SKYPILOT_CLUSTER_INFO"))
    try:
        check(args)
    except ValueError as err:
        print(f"{who}: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    watch_parent(getattr(args, "parent_pid", None), stop)
    opened = open_io(args, who)
    if opened is None:
        return EXIT_UNREACHABLE
    queue, store = opened
    report = EventLog(process_id)
    watcher = start_notice_watcher(args, stop, report)
    try:
        with queue:
            reason = serve(args, queue, store, stop, report)
    finally:
        if watcher is not None:
            watcher.stop()
    if reason == "misconfigured":
        return EXIT_UNREACHABLE
    return args.notice_exit_code if reason == "stopped" else 0


PARENT_POLL_S = 1.0
"""How often a worker started with --parent-pid checks that its parent is still there."""


def watch_parent(parent_pid: int | None, stop: threading.Event) -> None:
    """Set `stop` once `parent_pid` is no longer this process's parent (it ended: the process was re-parented), on a
    daemon thread; nothing without a parent pid. A killed run's workers then stop like on SIGTERM (commit, give the
    request back, exit) instead of polling a queue no one reads, holding their memory, for ever."""
    if parent_pid is None:
        return

    def watch() -> None:
        while not stop.wait(PARENT_POLL_S):
            if os.getppid() != parent_pid:
                stop.set()

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def default_instance_type(cluster_info: str | None) -> str:
    """`sky-<cloud>-<region>` on a SkyPilot VM (from SKYPILOT_CLUSTER_INFO), else `local-cpu`."""
    try:
        info = json.loads(cluster_info) if cluster_info else {}
        parts = [str(info[k]).lower() for k in ("cloud", "region") if info.get(k)]
    except (ValueError, TypeError, AttributeError):
        parts = []
    return "-".join(["sky", *parts]) if parts else "local-cpu"


def open_io(args: argparse.Namespace, who: str = "workers.rollout"):
    """(queue, store) of `args.queue` and `args.store`, checked reachable, or None after printing (as `who`) why
    one cannot be used. The SP node agent opens its own the same way."""
    try:
        queue = open_queue(args.queue)
        queue.stats()  # a SQLite file is opened lazily: touch it now so a bad path fails here
    except (ValueError, QueueUnavailableError, OSError) as err:
        print(f"{who}: cannot use the queue: {err}", file=sys.stderr)
        return None
    try:
        store = open_store(args.store)
        store.list_keys("runs/")  # reachability and credentials, before any work
    except (ValueError, StoreError, OSError) as err:
        queue.close()
        print(f"{who}: cannot use the tensor store: {err}", file=sys.stderr)
        return None
    return queue, store


def start_notice_watcher(args: argparse.Namespace, stop: threading.Event, report: EventLog):
    """A thread polling the cloud's preemption notice (None with --preemption-notice off); a notice sets `stop`."""
    check = notice_checker(args.preemption_notice, args.notice_url)
    if check is None:
        return None

    def on_notice() -> None:
        report("notice", cloud=args.preemption_notice)
        stop.set()

    return NoticeWatcher(check, on_notice, args.notice_interval_s).start()


if __name__ == "__main__":
    sys.exit(main())
