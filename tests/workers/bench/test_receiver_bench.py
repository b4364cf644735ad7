"""`spotlight bench receiver --json` at its smallest size: a kept receiver reads one patch per version from the
store, a replayed one an anchor too, and every version reaches the trainer's hash either way."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pipelines.cli import app


def test_bench_receiver_kept_reads_only_the_patch_and_replayed_reads_the_anchor_too():
    done = CliRunner().invoke(
        app, ["bench", "receiver", "--versions", "3", "--anchor-every", "2", "--layers", "0", "--json"]
    )
    assert done.exit_code == 0, done.output + repr(done.exception)
    (figures,) = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    rows = {(r["mode"], r["version"]): r for r in figures["sync"]["rows"]}
    assert set(rows) == {(mode, v) for mode in ("kept", "replayed") for v in (1, 2, 3)}
    assert all(r["reproduced"] for r in rows.values())
    for version in (1, 3):  # not anchored: nothing but the new patch, or an anchor and the patches after it too
        kept, replayed = rows["kept", version], rows["replayed", version]
        assert kept["chain_read_bytes"] == kept["patch_bytes"] < kept["dense_bytes"]
        assert replayed["chain_read_bytes"] >= replayed["dense_bytes"] + replayed["patch_bytes"]
    assert "memory" not in figures  # --layers 0 skips the memory runs
