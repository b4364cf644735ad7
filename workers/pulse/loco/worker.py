"""One PULSELoCo replica process: `python -m workers.pulse.loco.worker SPEC --replica I --out FILE`.

SPEC is the JSON run spec the launcher (workers/pulse/loco/launch.py) writes. The
process trains its shard for every mode in the spec and appends one JSON line per
round to FILE (plus `excluded` / `timeout` events); it never writes the ledger, the
launcher does (DuckDB allows one writer). Injected preemptions for tests: `--die-at-round N`
makes the process exit after its local steps of round N, before sending; `--die-after-round N`
right after round N's exchange returned (its payload counted), before it reports the round.
For DDP, N counts exchanges, one per local step.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

from resources.store import open_store
from workers.pulse.loco.launch import LocoRunConfig
from workers.pulse.loco.replica import Replica
from workers.pulse.loco.tasks import build_task, evaluate_bf16_view
from workers.pulse.loco.transport import GlooExchange, ReplicaExcludedError, RoundTimeoutError, StoreExchange


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="JSON run spec written by the launcher")
    parser.add_argument("--replica", type=int, required=True, help="this replica's index")
    parser.add_argument("--out", type=Path, required=True, help="JSON Lines report of this replica")
    parser.add_argument("--die-at-round", type=int, default=None, help="exit before sending in this round (tests)")
    parser.add_argument(
        "--die-after-round",
        type=int,
        default=None,
        help="exit after this round's exchange, before reporting it (tests)",
    )
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)  # replicas share the machine's cores
    deaths = _Deaths(args.die_at_round, args.die_after_round)
    run_replica(json.loads(args.spec.read_text()), args.replica, args.out, deaths)


@dataclass(frozen=True)
class _Deaths:
    """Injected preemptions: the exchange index before which, or after which, the process exits."""

    before: int | None = None
    after: int | None = None


def run_replica(spec: dict, replica: int, out: Path, deaths: _Deaths = _Deaths()) -> None:
    """Every mode of the spec, one after the other, reporting each round to `out`."""
    config = LocoRunConfig.from_json(spec["config"])
    exchanges = _Exchanges(spec, config, replica)
    try:
        with out.open("a") as report:
            for mode in config.modes:
                _run_mode(spec, config, mode, replica, exchanges, report, deaths)
    finally:
        exchanges.close()


def _run_mode(spec: dict, config, mode: str, replica: int, exchanges: "_Exchanges", report, deaths: _Deaths) -> None:
    start = _load_start(spec.get("start_path"))
    task = build_task(config.task, replica, config.num_replicas, start)
    exchange = exchanges.for_mode(mode, deaths)
    worker = Replica(
        task,
        exchange,
        mode=mode,
        replica=replica,
        inner_steps=config.inner_steps,
        outer=config.outer,
        zstd_level=config.zstd_level,
    )
    _write(report, {"event": "start", "mode": mode, "replica": replica, **_eval(task, config, 0, replica)})
    for round_index in range(config.rounds):
        try:
            record = worker.run_round(round_index)
        except ReplicaExcludedError as err:
            _write(
                report,
                {"event": "excluded", "mode": mode, "replica": replica, "round": round_index, "reason": str(err)},
            )
            return
        except RoundTimeoutError as err:
            _write(
                report, {"event": "timeout", "mode": mode, "replica": replica, "round": round_index, "reason": str(err)}
            )
            raise SystemExit(2) from err
        record.update(_eval(task, config, round_index + 1, replica))
        _write(report, {"event": "round", **record})


def _eval(task, config, rounds_done: int, replica: int) -> dict:
    """Held-out metric of the FP32 weights and of their BF16 view, every eval_every rounds and after
    the last, on replica 0 only: every replica holds the same global weights (hash-checked)."""
    if replica != 0 or (rounds_done % config.eval_every and rounds_done != config.rounds):
        return {"eval_metric": None, "eval_stderr": None}
    fp32, bf16 = task.evaluate(), evaluate_bf16_view(task)
    return {
        "eval_metric": fp32["metric"],
        "eval_stderr": fp32["stderr"],
        "eval_values": fp32["values"],
        "eval_bf16_metric": bf16["metric"],
        "eval_bf16_values": bf16["values"],
    }


class _Exchanges:
    """One transport for the whole process (a gloo group is set up once), one namespace per mode."""

    def __init__(self, spec: dict, config, replica: int) -> None:
        self.spec, self.config, self.replica = spec, config, replica
        self.gloo = None
        if config.transport == "gloo":
            self.gloo = GlooExchange(
                spec["init_method"], replica=replica, num_replicas=config.num_replicas, config=config.exchange
            )

    def for_mode(self, mode: str, deaths: _Deaths):
        if self.gloo is not None:
            exchange = self.gloo.exchange
        else:
            store = open_store(self.spec["store_url"])
            exchange = StoreExchange(
                store,
                f"{self.spec['prefix']}/{mode}",
                replica=self.replica,
                num_replicas=self.config.num_replicas,
                config=self.config.exchange,
            ).exchange
        if deaths == _Deaths():
            return exchange

        def dying(round_index: int, payload: bytes):
            if round_index == deaths.before:
                os._exit(3)  # a preempted process: no cleanup, no goodbye
            result = exchange(round_index, payload)
            if round_index == deaths.after:
                os._exit(3)  # the round counted this payload; the report never says so
            return result

        return dying

    def close(self) -> None:
        if self.gloo is not None:
            self.gloo.close()


def _load_start(path: str | None):
    if path is None:
        return None
    from safetensors.torch import load_file

    return load_file(path)


def _write(report, record: dict) -> None:
    report.write(json.dumps(record, sort_keys=True) + "\n")
    report.flush()


if __name__ == "__main__":
    main()
