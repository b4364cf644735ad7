"""The coordinator of a multi-trainer DDP / DiLoCo / PULSELoCo run: launch the replicas, then write the ledger.

Example:
    run = run_loco(config, Path("runs/loco-demo"))              # workers/pulse/loco/launch.py
    record_loco_ledger(Path("runs/loco-demo/ledger.duckdb"), "loco-demo", config, run)

Or from a shell: `python -m workers.coordinator.loco --mode pulseloco --out runs/loco-demo`.
"""

from __future__ import annotations

import json
from pathlib import Path

from resources.ledger import Ledger
from resources.ledger.records import SyncRecord
from workers.pulse.loco.launch import LocoRun, LocoRunConfig, run_loco, sync_rows, sync_totals
from workers.pulse.loco.maths import LOCO_MODES
from workers.pulse.loco.tasks import TaskConfig
from workers.pulse.loco.transport import TRANSPORTS, ExchangeConfig


def record_loco_ledger(path: Path, run_id: str, config: LocoRunConfig, run: LocoRun) -> None:
    """Write the run and, per mode, one `syncs` row per round and counted replica (kind = the mode)."""
    with Ledger(path) as ledger:
        ledger.start_run(run_id, preset=f"loco-{'+'.join(config.modes)}", config=config.to_json())
        for mode in config.modes:
            for row in sync_rows(run, mode):
                ledger.record_sync(
                    SyncRecord(
                        version=row["round"] + 1,
                        kind=mode,
                        replica=row["replica"],
                        iteration=row["round"],
                        dense_bytes=row["dense_bytes"],
                        patch_bytes=row["bytes_sent"],
                        changed_fraction=min(1.0, row["density"]),
                        encode_s=row["encode_s"],
                        weights_hash=row["weights_hash"],
                    )
                )
        ok = all(code == 0 for code in run.exit_codes.values())
        ledger.end_run(run_id, status="succeeded" if ok else "failed")


def main(argv: list[str] | None = None) -> None:
    """Run one mode and write its ledger: `python -m workers.coordinator.loco --mode pulseloco --out runs/x`."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m workers.coordinator.loco",
        description="Multi-replica DDP / DiLoCo / PULSELoCo training (one mode per run).",
    )
    parser.add_argument("--mode", choices=LOCO_MODES, default="pulseloco")
    parser.add_argument("--task", choices=("lm", "dit"), default="lm")
    parser.add_argument("--lr", type=float, default=1e-6, help="inner AdamW learning rate")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--inner-steps", type=int, default=8, help="local steps per round (H)")
    parser.add_argument("--transport", choices=TRANSPORTS, default="gloo")
    parser.add_argument("--store", default=None, help="store URL for --transport store (default: OUT/store)")
    parser.add_argument("--missing", choices=("survivors", "wait"), default="wait", help="a replica that never arrives")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="seconds a round waits for every replica")
    parser.add_argument("--out", type=Path, required=True, help="run folder: spec, reports, ledger.duckdb")
    args = parser.parse_args(argv)
    try:
        config = LocoRunConfig(
            modes=(args.mode,),
            num_replicas=args.replicas,
            rounds=args.rounds,
            inner_steps=args.inner_steps,
            task=TaskConfig(name=args.task, size="50m" if args.task == "lm" else "tiny", lr=args.lr),
            transport=args.transport,
            store_url=args.store,
            exchange=ExchangeConfig(timeout_s=args.timeout_s, missing_policy=args.missing),
        )
    except ValueError as err:
        parser.error(str(err))
    run = run_loco(config, args.out)
    record_loco_ledger(args.out / "ledger.duckdb", args.out.name, config, run)
    for row in sync_totals(run, args.mode):
        print(json.dumps({"mode": args.mode, **row}, sort_keys=True))
    if any(run.exit_codes.values()):
        raise SystemExit(f"replicas exited with {run.exit_codes}; see {args.out}/replica-*.jsonl")


if __name__ == "__main__":
    main()
