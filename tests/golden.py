"""Timing-free digests of a run's outputs, for the golden-run test (tests/workers/coordinator/test_golden.py).

`spotlight train --json` prints a record per iteration; everything but its timings is a
pure function of (preset, seed). `spotlight run` leaves a ledger; the digest keeps every
row and column that is not a clock reading or a dollar amount (both come from wall time).

On a CPU whose kernels are the ones the fixtures were recorded with (torch's CPU capability and version, kept in
golden_kernels.json) the comparison is exact, float-bit hashes included. On another CPU it allows what another
x86 CPU's float kernels change (`mismatches`): the presets run in FP32, so that is little.

Regenerate the fixtures (only for a deliberate change of behaviour, said in the commit):
    python -m tests.golden --write
Measure this machine's distance from them, to calibrate the tolerances (docs/log/kernel-sets.md):
    ATEN_CPU_CAPABILITY=avx2 python -m tests.golden --spread
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
TRAIN_TIMINGS = {"rollout_s", "train_s", "step_s"}
FULL_HELD_OUT = ["--validation-max-prompts", "64"]
"""The golden runs score all 64 held-out prompts, not cpu_smoke's 16: at 4 prompts a category one image near a
threshold would move a category's score by 0.25 on another CPU's kernels, past VALIDATION_TOL."""
GOLDEN_ARGS = {
    "train": ["train", "--preset", "cpu_smoke", "--seed", "0", "--json", *FULL_HELD_OUT],
    "train_nft": ["train", "--preset", "cpu_smoke_nft", "--seed", "0", "--json", *FULL_HELD_OUT],
    "run": ["run", "--preset", "cpu_smoke", "--rollouts", "inprocess", *FULL_HELD_OUT],
}
KERNELS_FILE = FIXTURES / "golden_kernels.json"
LEDGER_TABLES = {
    "iterations": "SELECT iteration, weights_version, status FROM iterations ORDER BY iteration",
    "phases": "SELECT iteration, phase FROM phases ORDER BY iteration, phase",
    "requests": "SELECT request_id, iteration, kind, prompt, seed, weights_version, attempts, result_hash, reward, "
    "status FROM requests ORDER BY request_id",
    "syncs": "SELECT version, kind, iteration, dense_bytes, patch_bytes, changed_fraction, weights_hash FROM syncs "
    "ORDER BY version",
    "train_steps": "SELECT iteration, step, loss, kl, reward_mean, reward_std, zero_std_ratio, clip_fraction, "
    "grad_norm, learning_rate FROM train_steps ORDER BY iteration",
    "validation": "SELECT iteration, weights_version, score, num_prompts FROM validation ORDER BY iteration",
    "validation_scores": "SELECT iteration, criterion, score FROM validation_scores ORDER BY iteration, criterion",
    "workers": "SELECT worker_id, role, spot FROM workers ORDER BY worker_id",
}


def _round(value):
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_round(v) for v in value]
    return value


def train_digest(stdout: str) -> list[dict]:
    """`spotlight train --json`'s records without their timings."""
    records = [json.loads(line) for line in stdout.splitlines() if line.strip().startswith("{")]
    return [_round({k: v for k, v in r.items() if k not in TRAIN_TIMINGS}) for r in records]


def ledger_digest(path: str | Path) -> dict[str, list]:
    """Every timing-free row of the ledger's tables (floats rounded to 6 digits)."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        return {name: [_round(list(row)) for row in con.execute(sql).fetchall()] for name, sql in LEDGER_TABLES.items()}
    finally:
        con.close()


def kernels() -> dict[str, str]:
    """What decides float bits on a CPU (workers/rollout/kernels.py's `cpu_identity`)."""
    from workers.rollout.kernels import cpu_identity

    return cpu_identity()


def recorded_on_these_kernels() -> bool:
    """Whether the fixtures were recorded with this machine's kernels (then they must match bit for bit)."""
    return KERNELS_FILE.is_file() and json.loads(KERNELS_FILE.read_text()) == kernels()


def produce(kind: str, workdir: Path) -> object:
    """Run the golden command of `kind` in `workdir` (a fresh folder) and digest its output."""
    import subprocess

    args = [str(Path(sys.executable).parent / "spotlight"), *GOLDEN_ARGS[kind]]
    if kind == "run":
        args += ["--run-dir", str(workdir / "run")]
    done = subprocess.run(
        args, cwd=workdir, capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    return ledger_digest(workdir / "run" / "ledger.duckdb") if kind == "run" else train_digest(done.stdout)


def _column(table: str, name: str) -> tuple[str, int]:
    """(table, index) of a column in LEDGER_TABLES' SELECT list."""
    return table, LEDGER_TABLES[table].removeprefix("SELECT ").split(" FROM ")[0].split(", ").index(name)


BIT_EXACT_COLUMNS = {_column("requests", "result_hash"), _column("syncs", "weights_hash")}
"""Columns that hash float bits (a rollout's bytes, the weights): another CPU's kernels change the last bit of a
float (measured: AVX2 against AVX512 kernels on one machine change every hash), so they are not compared."""
PATCH_BYTES = _column("syncs", "patch_bytes")
"""A PULSE patch's size counts the BF16 values that changed: off by a few dozen of a million across kernels
(measured 7.8e-5 relative at most: docs/log/kernel-sets.md)."""
VALIDATION_TOL = 0.13
"""Held-out scores are means of thresholded checks (a shape's colour, count, position) over 64 images, 16 per
category: across kernels an image near a threshold flips, and after two updates on other kernels two of one category
can (0.125). Measured against the fixtures on an AMD EPYC under ATEN_CPU_CAPABILITY default, avx2 and avx512
(docs/log/kernel-sets.md): 0.125 at most (DEFAULT's kernels, the NFT golden's iteration 2). The training numbers
(rewards, losses, gradient norms) agree to 5 digits across kernels (1.8e-5 relative at most) and are held to 1e-4."""
FLOAT_REL = 1e-4


def _validation_path(path: tuple) -> bool:
    """A held-out score: the validation figures, and the proxy and gold held-out means `spotlight train` prints
    beside them (the same images scored: `proxy_heldout` is `validation_partial`, `gold_heldout` the strict score)."""
    return any(isinstance(p, str) and (p.startswith("validation") or p.endswith("_heldout")) for p in path)


def exact_mismatches(actual, expected) -> list[str]:
    """Where `actual` differs from `expected` at all (the same kernels give the same bits), one line a table."""
    if isinstance(expected, dict):
        keys = sorted(set(actual) | set(expected))
        return [
            f"{k}: {actual.get(k)!r:.300} != {expected.get(k)!r:.300}" for k in keys if actual.get(k) != expected.get(k)
        ]
    return [
        f"record {i}: {a!r:.300} != {e!r:.300}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=False))
        if a != e
    ] + ([f"{len(actual)} records, fixture has {len(expected)}"] if len(actual) != len(expected) else [])


def mismatches(actual, expected, path: tuple = ()) -> list[str]:
    """Where `actual` differs from `expected` beyond what another x86 CPU's float kernels change, one line each."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        if set(actual) != set(expected):
            return [f"{path}: keys {sorted(set(actual) ^ set(expected))} in one digest only"]
        return [m for k in expected for m in mismatches(actual[k], expected[k], (*path, k))]
    if isinstance(expected, list) and isinstance(actual, list):
        if len(actual) != len(expected):
            return [f"{path}: {len(actual)} rows, fixture has {len(expected)}"]
        table = path[0] if len(path) == 2 else None  # a ledger row: (table, row index)
        out = []
        for i, (a, e) in enumerate(zip(actual, expected, strict=False)):
            if table is not None and (table, i) in BIT_EXACT_COLUMNS:
                continue
            if table is not None and (table, i) == PATCH_BYTES:
                if abs(a - e) > 1e-3 * e:
                    out.append(f"{(*path, i)}: patch of {a} bytes, fixture {e}")
                continue
            out += mismatches(a, e, (*path, i))
        return out
    if isinstance(expected, float) and isinstance(actual, (int, float)) and not isinstance(actual, bool):
        tol = VALIDATION_TOL if _validation_path(path) else max(FLOAT_REL * abs(expected), 2e-6)
        return [] if abs(actual - expected) <= tol else [f"{path}: {actual} != {expected} (tolerance {tol:g})"]
    return [] if actual == expected else [f"{path}: {actual!r} != {expected!r}"]


def spread(actual, expected) -> dict[str, float | int]:
    """How far `actual` is from `expected`, by what the tolerances of `mismatches` hold: the largest relative
    difference of a training number, the largest absolute one of a held-out score, the largest relative one of a
    patch size, and how many float-bit hashes differ. (Structure differences are `mismatches`' business.)"""
    out = {"training_rel": 0.0, "heldout_abs": 0.0, "patch_bytes_rel": 0.0, "hashes_differ": 0}

    def walk(a, e, path: tuple) -> None:
        if isinstance(e, dict) and isinstance(a, dict):
            for k in e.keys() & a.keys():
                walk(a[k], e[k], (*path, k))
        elif isinstance(e, list) and isinstance(a, list):
            table = path[0] if len(path) == 2 else None
            for i, (x, y) in enumerate(zip(a, e, strict=False)):
                if table is not None and (table, i) in BIT_EXACT_COLUMNS:
                    out["hashes_differ"] += x != y
                elif table is not None and (table, i) == PATCH_BYTES:
                    out["patch_bytes_rel"] = max(out["patch_bytes_rel"], abs(x - y) / y)
                else:
                    walk(x, y, (*path, i))
        elif isinstance(e, float) and isinstance(a, (int, float)) and not isinstance(a, bool):
            if _validation_path(path):
                out["heldout_abs"] = max(out["heldout_abs"], abs(a - e))
            elif e:
                out["training_rel"] = max(out["training_rel"], abs(a - e) / abs(e))

    walk(json.loads(json.dumps(actual)), expected, ())
    return out


def dumps(digest) -> str:
    """One record or row per line, so a fixture's diff shows what changed."""
    if isinstance(digest, dict):
        body = ",\n".join(
            f" {json.dumps(k)}: [\n" + ",\n".join(f"  {json.dumps(r)}" for r in rows) + "\n ]"
            for k, rows in digest.items()
        )
        return "{\n" + body + "\n}\n"
    return "[\n" + ",\n".join(f" {json.dumps(r, sort_keys=True)}" for r in digest) + "\n]\n"


def fixture_path(kind: str) -> Path:
    return FIXTURES / f"golden_{kind}_cpu_smoke.json"


def compare(actual, kind: str) -> list[str]:
    """`actual` (a digest) against the fixture of `kind`: exactly on the recording kernels, else within what
    another CPU's kernels change."""
    expected = json.loads(fixture_path(kind).read_text())
    actual = json.loads(json.dumps(actual))  # tuples as lists, as the fixture holds them
    return exact_mismatches(actual, expected) if recorded_on_these_kernels() else mismatches(actual, expected)


if __name__ == "__main__":
    import tempfile

    if sys.argv[1:] == ["--spread"]:  # calibrating the tolerances: run it under each ATEN_CPU_CAPABILITY
        for kind in GOLDEN_ARGS:
            with tempfile.TemporaryDirectory() as tmp:
                digest = json.loads(json.dumps(produce(kind, Path(tmp))))
            fixture = json.loads(fixture_path(kind).read_text())
            found = {**spread(digest, fixture), "mismatches": mismatches(digest, fixture)}
            print(json.dumps({"kind": kind, "cpu_capability": kernels()["cpu_capability"], **found}), flush=True)
        sys.exit(0)
    if sys.argv[1:] != ["--write"]:
        sys.exit(
            "usage: python -m tests.golden --write   (rewrites tests/fixtures/golden_*.json)\n"
            "       python -m tests.golden --spread  (this machine's distance from them, one JSON line a kind)"
        )
    for kind in GOLDEN_ARGS:
        with tempfile.TemporaryDirectory() as tmp:
            fixture_path(kind).write_text(dumps(produce(kind, Path(tmp))))
        print("wrote", fixture_path(kind))
    KERNELS_FILE.write_text(json.dumps(kernels(), indent=1) + "\n")
    print("wrote", KERNELS_FILE)
