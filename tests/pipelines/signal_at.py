"""`spotlight ...` that sends a signal to its own process at chosen points of the run, so a test stops a run at an
exact place whatever the machine's load: `python -m tests.pipelines.signal_at SIGINT POINT[,POINT] -- run ...`.

Each POINT sends the signal once, when the run first gets there:
  run-success:<partition>    while Dagster records the success of that iteration partition's run: after the last
                             step's compute, where Dagster's own SIGINT handler only sets a flag it clears when
                             the run ends (the place where a Ctrl-C used to be lost)
  phase:<name>:<iteration>   as workers.coordinator.phases.<name> starts on that iteration: inside a step's
                             compute, where Dagster raises DagsterExecutionInterruptedError
  cluster-stop               as the local worker cluster's stop begins (a second Ctrl-C while the run stops)
The signal is a real one (os.kill on this process): what follows it is the command's own path."""

from __future__ import annotations

import os
import signal
import sys


def _send_once(signum: int, where: str):
    sent = []

    def send() -> None:
        if not sent:
            sent.append(where)
            print(f"signal_at: {signal.Signals(signum).name} at {where}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signum)

    return send


def _at_run_success(send, partition: str) -> None:
    import dagster as dg

    handle = dg.DagsterInstance.handle_new_event

    def handle_new_event(instance, event, *args, **kwargs):
        out = handle(instance, event, *args, **kwargs)
        if event.dagster_event is not None and event.dagster_event.event_type == dg.DagsterEventType.RUN_SUCCESS:
            run = instance.get_run_by_id(event.run_id)
            if run is not None and run.tags.get("dagster/partition") == partition:
                send()
        return out

    dg.DagsterInstance.handle_new_event = handle_new_event


def _at_phase(send, name: str, iteration: int) -> None:
    # Before assets/ is imported: its assets take the phase functions from this module when they are defined.
    from workers.coordinator import phases

    phase = getattr(phases, name)

    def signalled(ctx, k, *args, **kwargs):
        if k == iteration:
            send()
        return phase(ctx, k, *args, **kwargs)

    setattr(phases, name, signalled)


def _at_cluster_stop(send) -> None:
    from resources.cluster import LocalCluster

    stop = LocalCluster.stop

    def signalled(cluster, *args, **kwargs):
        send()
        return stop(cluster, *args, **kwargs)

    LocalCluster.stop = signalled


def main(argv: list[str]) -> None:
    signame, points, dashes, *command = argv
    assert dashes == "--", "usage: signal_at SIGNAL POINT[,POINT] -- spotlight arguments"
    for point in points.split(","):
        send = _send_once(signal.Signals[signame], point)
        kind, *where = point.split(":")
        if kind == "run-success":
            _at_run_success(send, *where)
        elif kind == "phase":
            _at_phase(send, where[0], int(where[1]))
        elif kind == "cluster-stop":
            _at_cluster_stop(send)
        else:
            raise SystemExit(f"signal_at: unknown point {point!r}")
    from pipelines.cli import app

    app(command, prog_name="spotlight")


if __name__ == "__main__":
    main(sys.argv[1:])
