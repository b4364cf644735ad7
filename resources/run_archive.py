"""Copy a finished run's folder (ledger, config.yaml, report/) into the tensor store, before its node goes away.

The reserved node keeps the ledger on its own disk, and SkyPilot's autostop takes that disk
down with the node once the run line has exited; so the run block copies the run's record
to `archive/{run folder name}/...` in the store first (sky/reserved.yaml). Store and queue
folders inside the run folder (a local run's) are left out: they are the store itself.

Example:
    python -m resources.run_archive --run-dir runs/cloud --store s3://bucket/spotlight
    keys = archive_run_dir(Path("runs/cloud"), open_store("s3://bucket/spotlight"))
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from resources.store import open_store
from resources.store.base import StoreError, TensorStore

ARCHIVED = ("ledger.duckdb", "config.yaml", "metrics.jsonl", "report")
"""What of a run folder is archived: the ledger, the run's spec, its metrics and report/ (files under it)."""
PREFIX = "archive"


def archive_run_dir(run_dir: Path, store: TensorStore) -> list[str]:
    """Put each archived file of `run_dir` at archive/{run_dir's name}/{relative path}; returns the keys written."""
    keys = []
    for name in ARCHIVED:
        path = run_dir / name
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] * path.is_file()
        for file in files:
            key = f"{PREFIX}/{run_dir.resolve().name}/{file.relative_to(run_dir).as_posix()}"
            store.put_bytes(key, file.read_bytes())
            keys.append(key)
    return keys


def main(argv: list[str] | None = None) -> int:
    """Archive a run folder into the store; exit 1 (saying why) when the store refuses, 0 otherwise."""
    parser = argparse.ArgumentParser(prog="python -m resources.run_archive", description=main.__doc__.split(";")[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="The run folder (spotlight run --run-dir).")
    parser.add_argument("--store", required=True, help="The run's tensor store URL (s3://bucket/prefix or a folder).")
    args = parser.parse_args(argv)

    try:
        keys = archive_run_dir(args.run_dir, open_store(args.store))
    except (StoreError, OSError, ValueError) as err:
        print(f"resources.run_archive: the run folder was not archived ({type(err).__name__}: {err})", file=sys.stderr)
        return 1
    print(f"resources.run_archive: {len(keys)} file(s) of {args.run_dir} archived under {PREFIX}/", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
