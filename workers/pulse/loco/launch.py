"""Launch a multi-replica DDP / DiLoCo / PULSELoCo run as separate processes, and collect what they report.

The launcher writes the start weights (safetensors), one spec, starts one
`workers.pulse.loco.worker` process per replica, waits and reads their JSON Lines
reports. The coordinator (workers/coordinator/loco.py) writes the run's ledger.

Example:
    config = LocoRunConfig(modes=("pulseloco",), num_replicas=2, rounds=4, inner_steps=8)
    run = run_loco(config, Path("runs/loco-demo"))

Or from a shell: `python -m workers.coordinator.loco --mode pulseloco --out runs/loco-demo`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from resources.urls import absolute_url
from workers.pulse.loco.maths import LOCO_MODES, OuterConfig
from workers.pulse.loco.tasks import TaskConfig, lm_start_state
from workers.pulse.loco.transport import TRANSPORTS, ExchangeConfig


@dataclass(frozen=True)
class LocoRunConfig:
    """A multi-replica run: which sync modes, how many replicas and rounds, over which transport."""

    modes: tuple[str, ...] = ("pulseloco",)
    """Sync modes to run, one after the other, each from the same start: ddp, diloco, pulseloco."""
    num_replicas: int = 2
    """Replica processes, each training on its own shard of the data."""
    rounds: int = 4
    """Outer rounds (DDP: groups of inner_steps steps, for reporting)."""
    inner_steps: int = 8
    """Local optimizer steps per round (DiLoCo's H)."""
    outer: OuterConfig = field(default_factory=OuterConfig)
    """Outer Nesterov SGD (DiLoCo and PULSELoCo)."""
    task: TaskConfig = field(default_factory=TaskConfig)
    """What every replica trains."""
    transport: str = "gloo"
    """gloo (torch.distributed on CPU) or store (the tensor store at store_url)."""
    store_url: str | None = None
    """Tensor store for transport=store (default: a folder inside the run folder)."""
    exchange: ExchangeConfig = field(default_factory=lambda: ExchangeConfig(missing_policy="wait"))
    """Round timeout and what happens when a replica never arrives."""
    zstd_level: int = 1
    """zstd level of PULSELoCo payloads."""
    eval_every: int = 1
    """Held-out evaluation every this many rounds (and after the last)."""

    def __post_init__(self) -> None:
        if not self.modes or any(m not in LOCO_MODES for m in self.modes) or len(set(self.modes)) != len(self.modes):
            raise ValueError(f"LocoRunConfig.modes must be distinct values of {LOCO_MODES}, got {self.modes}")
        if not 1 <= self.num_replicas <= 64:
            raise ValueError(f"LocoRunConfig.num_replicas must be in [1, 64], got {self.num_replicas}")
        if not 1 <= self.rounds <= 100_000 or not 1 <= self.inner_steps <= 100_000:
            raise ValueError(
                f"LocoRunConfig.rounds and inner_steps must be in [1, 100000], got {self.rounds}, {self.inner_steps}"
            )
        if self.transport not in TRANSPORTS:
            raise ValueError(f"LocoRunConfig.transport must be one of {TRANSPORTS}, got {self.transport!r}")
        if self.transport == "gloo" and self.exchange.missing_policy != "wait":
            raise ValueError(
                "LocoRunConfig.exchange.missing_policy must be 'wait' with transport='gloo'; "
                "use transport='store' to continue with the survivors"
            )
        if not -7 <= self.zstd_level <= 22:
            raise ValueError(f"LocoRunConfig.zstd_level must be in [-7, 22], got {self.zstd_level}")
        if self.eval_every < 1:
            raise ValueError(f"LocoRunConfig.eval_every must be >= 1, got {self.eval_every}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict) -> "LocoRunConfig":
        return cls(
            **{
                **raw,
                "modes": tuple(raw["modes"]),
                "outer": OuterConfig(**raw["outer"]),
                "task": TaskConfig(**raw["task"]),
                "exchange": ExchangeConfig(**raw["exchange"]),
            }
        )


@dataclass(frozen=True)
class LocoRun:
    """What the replicas reported."""

    events: list[dict]
    """Every JSON line of every replica (events start, round, excluded, timeout)."""
    exit_codes: dict[int, int]
    """Exit code of each replica process."""
    wall_s: float

    def rounds(self, mode: str) -> list[dict]:
        return [e for e in self.events if e["event"] == "round" and e["mode"] == mode]


def run_loco(
    config: LocoRunConfig,
    out: Path,
    *,
    die_at: dict[int, int] | None = None,
    die_after: dict[int, int] | None = None,
    timeout_s: float = 3600.0,
) -> LocoRun:
    """Run every replica as a process and wait for all.

    Injected deaths, {replica: round}: `die_at` exits before sending that round's payload,
    `die_after` right after the round counted it, before the replica reports the round.
    Every path handed to a replica (spec, reports, store) is absolute: it may run in another directory.
    """
    out = out.expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    spec = {
        "config": config.to_json(),
        "init_method": f"file://{out}/gloo-rendezvous-{time.time_ns()}",
        "store_url": absolute_url(config.store_url) if config.store_url else str(out / "store"),
        "prefix": f"loco/{out.name or 'run'}-{time.time_ns()}",
    }
    if config.task.name == "lm":
        from safetensors.torch import save_file

        save_file(lm_start_state(config.task), str(out / "start.safetensors"))
        spec["start_path"] = str(out / "start.safetensors")
    (out / "spec.json").write_text(json.dumps(spec, indent=1))
    reports = [out / f"replica-{r}.jsonl" for r in range(config.num_replicas)]
    processes = {}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for replica, report in enumerate(reports):
        report.unlink(missing_ok=True)
        command = [
            sys.executable,
            "-m",
            "workers.pulse.loco.worker",
            str(out / "spec.json"),
            "--replica",
            str(replica),
            "--out",
            str(report),
        ]
        if die_at and replica in die_at:
            command += ["--die-at-round", str(die_at[replica])]
        if die_after and replica in die_after:
            command += ["--die-after-round", str(die_after[replica])]
        processes[replica] = subprocess.Popen(command, env=env)
    try:
        deadline = time.monotonic() + timeout_s
        exit_codes = {r: p.wait(timeout=max(0.0, deadline - time.monotonic())) for r, p in processes.items()}
    finally:
        for process in processes.values():  # on timeout or interrupt: no replica outlives its launcher
            if process.poll() is None:
                process.kill()
                process.wait()
    events = [json.loads(line) for report in reports if report.exists() for line in report.read_text().splitlines()]
    return LocoRun(events, exit_codes, time.perf_counter() - started)


def sync_rows(run: LocoRun, mode: str) -> list[dict]:
    """One row per round and per replica whose payload the round counted, each exactly once.

    A round's members all report the same `counted` sizes, so a sender that died after its
    payload was counted, before it could report, still gets its row (from its peers); a
    replica that died before sending, or whose payload came too late, gets none. Dense
    bytes are the dense FP32 exchange of the same thing: the pseudo-gradient (4 B per
    parameter) per round, or for DDP the gradient per counted local step.
    """
    by_round: dict[int, dict[int, dict]] = {}
    for event in run.rounds(mode):
        by_round.setdefault(event["round"], {})[event["replica"]] = event  # a replica reports a round once
    rows = []
    for round_index in sorted(by_round):
        reports = by_round[round_index]
        hashes = {r["weights_hash"] for r in reports.values()}
        agreed = hashes.pop() if len(hashes) == 1 else None  # None: replicas disagree
        numel = next(iter(reports.values()))["numel"]
        counted: dict[int, dict] = {}
        for report in reports.values():
            for sender, tally in report["counted"].items():
                counted.setdefault(int(sender), tally)
        for sender in sorted(counted):
            tally, own = counted[sender], reports.get(sender)
            rows.append(
                {
                    "round": round_index,
                    "replica": sender,
                    "bytes_sent": tally["bytes"],
                    "values_sent": tally["values"],
                    "numel": numel,
                    "density": tally["values"] / (numel * tally["exchanges"]),
                    "dense_bytes": 4 * numel * tally["exchanges"],
                    "reported": own is not None,
                    "encode_s": own["encode_s"] if own else None,
                    "weights_hash": agreed,
                }
            )
    return rows


def sync_totals(run: LocoRun, mode: str) -> list[dict]:
    """Per round: bytes per counted replica, density, and the replicas counted (each once)."""
    by_round: dict[int, list[dict]] = {}
    for row in sync_rows(run, mode):
        by_round.setdefault(row["round"], []).append(row)
    totals = []
    for round_index, rows in sorted(by_round.items()):
        totals.append(
            {
                "round": round_index,
                "replicas": [r["replica"] for r in rows],
                "bytes_per_replica": sum(r["bytes_sent"] for r in rows) / len(rows),
                "density": sum(r["density"] for r in rows) / len(rows),
                "encode_s": max((r["encode_s"] for r in rows if r["encode_s"] is not None), default=None),
                "numel": rows[0]["numel"],
                "weights_hash": rows[0]["weights_hash"],
            }
        )
    return totals
