"""One run seed is one run on this machine, whatever its load: `spotlight run` twice, once with its spot workers
stalled (stopped whenever exploration is handed out until the update has ended, as on a machine busy with other
work), trains the same seeds into the same weights and reads the same held-out curve.

What could make them differ, and why it does not: exploration stops on a request budget counted in samples, and the
seed plan waits for exactly the planned requests (workers/explore/session.py); the bandit's costs are samples, not
seconds; every request's batch is fixed by the request and its noise by its seed (a preempted request resumes
bit-identically); validation runs in the coordinator on fixed seeds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from resources.ledger.db import query_ledger

pytestmark = pytest.mark.nightly  # two whole runs, about 3 min: make test-all (CI: test_request_budget.py)

AFTER_S = 1.0
"""Seconds the slowed run's workers stay stopped after the update they wait out has published its weights."""
HELD_OUT = ["three red circles", "two purple squares", "a blue triangle left of a green circle", "one yellow square"]


def _descendants(root: int) -> list[int]:
    """Process ids under `root` (children, grandchildren, ...), from /proc."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [root]
    while frontier:
        children = [p for p, pp in parent.items() if pp in frontier]
        out += children
        frontier = children
    return out


def _rollout_workers(root: int) -> list[int]:
    pids = []
    for pid in _descendants(root):
        try:
            if b"workers.rollout" in Path(f"/proc/{pid}/cmdline").read_bytes():
                pids.append(pid)
        except OSError:
            continue
    return pids


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            continue


def _explored_iterations(queue_db: Path) -> set[int]:
    """Iterations whose exploration requests are on the run's SQLite queue (read-only, beside the run)."""
    if not queue_db.is_file():
        return set()
    try:
        with contextlib.closing(sqlite3.connect(f"file:{queue_db}?mode=ro", uri=True, timeout=5)) as db:
            return {k for (k,) in db.execute("SELECT DISTINCT iteration FROM requests WHERE kind = 'explore'")}
    except sqlite3.Error:
        return set()


def _stall_workers(root: int, run_dir: Path, done: threading.Event) -> None:
    """A slowed machine: whenever an iteration's exploration is handed out, the run's rollout workers stop until the
    update has published its weights (and `AFTER_S` more), so exploration finishes only after training has ended."""
    seen: set[int] = set()
    while not done.is_set():
        for k in sorted(_explored_iterations(run_dir / "queue.db") - seen):
            seen.add(k)
            pids = _rollout_workers(root)
            _signal_all(pids, signal.SIGSTOP)
            trained = run_dir / "store" / "runs" / run_dir.name / "weights" / f"v{k + 1:06d}" / "_MANIFEST.json"
            for _ in range(3000):  # at most 5 min
                if trained.is_file() or done.wait(0.1):
                    break
            done.wait(AFTER_S)
            _signal_all(pids, signal.SIGCONT)
        done.wait(0.02)


def _run(run_dir: Path, held_out: Path, slowed: bool) -> Path:
    """`spotlight run` of cpu_smoke, seed 3, 2 iterations; returns its ledger."""
    cmd = [
        str(Path(sys.executable).parent / "spotlight"),
        "run",
        "--run-dir",
        str(run_dir),
        "--preset",
        "cpu_smoke",
        "--iterations",
        "2",
        "--seed",
        "3",
        "--validation-prompts",
        str(held_out),
        "--preemptions-per-hour",
        "0",
    ]
    proc = subprocess.Popen(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    done = threading.Event()
    slower = threading.Thread(target=_stall_workers, args=(proc.pid, run_dir, done), daemon=True)
    if slowed:
        slower.start()
    try:
        output, _ = proc.communicate(timeout=600)
    finally:
        done.set()
        if slowed:
            slower.join()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-3000:]
    return run_dir / "ledger.duckdb"


def _rows(ledger: Path, sql: str) -> list[tuple]:
    return query_ledger(ledger, sql).rows


def _late_explorations(ledger: Path) -> int:
    """Planned exploration requests that finished after their iteration's training ended (a stop at the end of
    training would have planned without them)."""
    return _rows(
        ledger,
        "SELECT count(*) FROM requests r JOIN phases p ON p.iteration = r.iteration AND p.phase = 'train' "
        "WHERE r.kind = 'explore' AND r.status = 'done' AND r.finished_at > p.ended_at",
    )[0][0]


def test_a_run_seed_trains_the_same_seeds_into_the_same_weights_with_its_workers_slowed_down(tmp_path):
    held_out = tmp_path / "heldout.txt"
    held_out.write_text("\n".join(HELD_OUT) + "\n")
    idle = _run(tmp_path / "idle", held_out, slowed=False)
    slowed = _run(tmp_path / "slowed", held_out, slowed=True)

    same = {
        "held-out curve": "SELECT weights_version, score FROM validation ORDER BY 1",
        "held-out criteria": "SELECT iteration, criterion, score FROM validation_scores ORDER BY 1, 2",
        "trained seeds": "SELECT iteration, prompt_index, planner, seeds, trained_variance FROM seed_groups "
        "ORDER BY 1, 2",
        "exploration": "SELECT iteration, arm, budget_s, time_used_s, num_requests FROM exploration ORDER BY 1",
        "weights": "SELECT version, weights_hash FROM syncs WHERE weights_hash IS NOT NULL ORDER BY 1, kind, replica",
        "updates": "SELECT iteration, step, loss, reward_mean, reward_std FROM train_steps ORDER BY 1, 2",
    }
    for what, sql in same.items():
        a, b = _rows(idle, sql), _rows(slowed, sql)
        assert a and a == b, (what, a, b)
    # Exploration chose what iteration 1 trained on (not the default seeds), so the identity covers its plan.
    planners = {p for (p,) in _rows(idle, "SELECT planner FROM seed_groups WHERE iteration = 1")}
    assert planners and all(p.startswith("explore:") for p in planners), planners
    # The stall mattered: the slowed run's planned exploration finished only after training had ended (on the wall
    # clock, those prompts would have kept random seeds).
    assert _late_explorations(slowed) > 0
    waited = _rows(slowed, "SELECT max(overhead_s) FROM exploration")[0][0]
    assert waited > 0.5, waited  # the seed plan waited for the planned requests
