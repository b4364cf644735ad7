"""Stopping `spotlight run` before its end: at the --max-usd spend cap, on Ctrl-C (SIGINT) and on SIGTERM. Each stop
says why and how to continue, marks the run interrupted in the ledger, and `--resume` finishes the run."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from dagster._utils.interrupts import capture_interrupts
from typer.testing import CliRunner

from pipelines.cli import app
from pipelines.run_stop import RunInterrupted, StopSignals
from resources.ledger.db import query_ledger
from tests.paths import REPO_ROOT

HINT = "continue it with: spotlight run --run-dir {} --resume"


@pytest.fixture(autouse=True)
def _torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def prompts(tmp_path) -> Path:
    """Two held-out prompts: validation, run at every iteration of cpu_smoke, stays short."""
    path = tmp_path / "heldout.txt"
    path.write_text("three red circles\ntwo purple squares\n")
    return path


def _smoke_args(run_dir: Path, prompts: Path, iterations: int = 1) -> list[str]:
    """`iterations` training iterations and the final one (validation and report), sampled in this process."""
    return [
        "run",
        "--run-dir",
        str(run_dir),
        "--preset",
        "cpu_smoke",
        "--rollouts",
        "inprocess",
        "--iterations",
        str(iterations),
        "--validation-prompts",
        str(prompts),
    ]


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})


def _ledger(run_dir: Path, sql: str) -> list[tuple]:
    return query_ledger(run_dir / "ledger.duckdb", sql).rows


def _finished_by_resume(run_dir: Path, iterations: int = 1) -> None:
    """`--resume` skips the iteration done before the stop, does the rest, and the ledger says the run succeeded."""
    done = _invoke("run", "--run-dir", str(run_dir), "--resume")
    assert done.exit_code == 0, done.output
    assert "it   0  done earlier (resumed)" in done.output and f"it   {iterations}  held-out" in done.output
    assert _ledger(run_dir, "SELECT iteration, status FROM iterations ORDER BY 1") == [
        (k, "succeeded") for k in range(iterations + 1)
    ]
    assert _ledger(run_dir, "SELECT status FROM runs") == [("succeeded",)]
    assert _ledger(run_dir, "SELECT count(*), count(DISTINCT iteration) FROM train_steps") == [
        (iterations, iterations)
    ]  # none trained twice


def test_max_usd_stops_the_run_after_the_iteration_that_reached_it_and_resume_finishes_it(tmp_path, prompts):
    run_dir = tmp_path / "capped"
    done = _invoke(*_smoke_args(run_dir, prompts), "--max-usd", "0.00001")
    assert done.exit_code == 0, done.output  # a cap reached is the run doing what it was told, not a failure
    line = " ".join(done.output.split())
    assert "spotlight run stopped: the run spent $" in line
    assert "reaching --max-usd 1e-05, after iteration 0; continue with --resume and a higher --max-usd" in line
    assert "it   1" not in done.output
    spent = _ledger(run_dir, "SELECT usd_total FROM run_cost")[0][0]
    assert spent >= 0.00001
    assert _ledger(run_dir, "SELECT iteration, status FROM iterations") == [(0, "succeeded")]
    assert _ledger(run_dir, "SELECT status FROM runs") == [("interrupted",)]

    # The cap is not stored: the same cap again stops before any work, a higher one (or none) lets it finish.
    again = _invoke("run", "--run-dir", str(run_dir), "--resume", "--max-usd", "0.00001")
    assert again.exit_code == 0, again.output
    assert "reaching --max-usd 1e-05, before its next iteration" in " ".join(again.output.split())
    assert _ledger(run_dir, "SELECT count(*) FROM iterations") == [(1,)]
    _finished_by_resume(run_dir)


def _spotlight(*args: str) -> subprocess.Popen:
    env = {**os.environ, "COLUMNS": "400", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines", *args],
        cwd=REPO_ROOT,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _wait_for_line(proc: subprocess.Popen, prefix: str, timeout_s: float) -> list[str]:
    """stderr lines up to and including the first that starts with `prefix`; fails at the deadline or on exit."""
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stderr, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not selector.select(timeout=max(0.0, deadline - time.monotonic())):
                continue
            line = proc.stderr.readline()
            if not line:
                break  # the process closed stderr: it ended
            lines.append(line)
            if line.startswith(prefix):
                return lines
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    pytest.fail(f"no line starting {prefix!r} within {timeout_s:g} s; stderr so far:\n{''.join(lines)[-3000:]}")


def _stopped(proc: subprocess.Popen, sig: signal.Signals, timeout_s: float = 120) -> tuple[int, str]:
    proc.send_signal(sig)
    try:
        _, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"spotlight run still running {timeout_s:g} s after {sig.name}")
    return proc.returncode, stderr


def _kill_naming(text: str) -> None:
    """SIGKILL the live processes whose command line mentions `text`."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                os.kill(int(cmdline.parent.name), signal.SIGKILL)
        except (OSError, ProcessLookupError):  # the process ended while we looked
            continue


def _processes_naming(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (the run folder: the run's worker processes)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # the process ended while we looked
            continue
        if text in args:
            found.append(args)
    return found


def _signalled_run(signame: str, point: str, *args: str, timeout_s: float = 240) -> tuple[int, str]:
    """`spotlight *args` that sends itself `signame` at `point` (tests/pipelines/signal_at.py); its exit code and
    stderr, once it ended."""
    env = {**os.environ, "COLUMNS": "400", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.pipelines.signal_at", signame, point, "--", *args],
            cwd=REPO_ROOT,
            env=env,
            text=True,
            capture_output=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(
            f"spotlight run still running {timeout_s:g} s after it started; stderr:\n{(err.stderr or '')[-3000:]}"
        )
    for where in point.split(","):  # sent where the test meant
        assert f"signal_at: {signame} at {where}" in done.stderr, done.stderr[-3000:]
    return done.returncode, done.stderr


@pytest.mark.slow  # about 40 s: a stopped run and its resume
def test_ctrl_c_while_dagster_records_an_iteration_stops_the_run_before_the_next_and_resume_finishes_it(
    tmp_path, prompts
):
    """A SIGINT that arrives after an iteration's last step, while Dagster records its run's success, reached only
    Dagster's own handler, whose flag Dagster clears when the run ends: the walk went on and the run finished, exit
    0. It must stop there as Ctrl-C does anywhere else."""
    run_dir = tmp_path / "interrupted"
    code, stderr = _signalled_run("SIGINT", "run-success:it-000000", *_smoke_args(run_dir, prompts))
    assert code == 1, stderr[-2000:]
    assert "spotlight run stopped: interrupted by Ctrl-C (SIGINT)" in stderr
    assert HINT.format(run_dir) in " ".join(stderr.split())
    assert "it   1" not in stderr
    assert _ledger(run_dir, "SELECT iteration, status FROM iterations") == [(0, "succeeded")]
    assert _ledger(run_dir, "SELECT status FROM runs") == [("interrupted",)]
    _finished_by_resume(run_dir)


@pytest.mark.slow  # about 25 s
def test_ctrl_c_inside_a_phase_abandons_it_and_stops_the_run_as_interrupted(tmp_path, prompts):
    """Inside a step's compute Dagster turns the signal into a failed step; the run reports the interruption, not
    a failed iteration, and trains nothing more."""
    run_dir = tmp_path / "interrupted"
    code, stderr = _signalled_run("SIGINT", "phase:train_phase:0", *_smoke_args(run_dir, prompts))
    assert code == 1, stderr[-2000:]
    assert "spotlight run stopped: interrupted by Ctrl-C (SIGINT)" in stderr
    assert "failed" not in stderr.split("spotlight run stopped:")[1]
    assert HINT.format(run_dir) in " ".join(stderr.split())
    assert _ledger(run_dir, "SELECT count(*) FROM iterations WHERE status = 'succeeded'") == [(0,)]
    assert _ledger(run_dir, "SELECT count(*) FROM train_steps") == [(0,)]
    assert _ledger(run_dir, "SELECT status FROM runs") == [("interrupted",)]


@pytest.mark.slow  # about 30 s
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="lists processes through /proc")
def test_a_second_ctrl_c_while_the_run_stops_its_workers_ends_them_at_once(tmp_path, prompts):
    """The first Ctrl-C lets busy workers commit before they exit; a second one, as that stop begins, must not leave
    them running on their own (it used to skip their stop altogether)."""
    run_dir = tmp_path / "twice"
    code, stderr = _signalled_run(
        "SIGINT",
        "phase:rollout_phase:0,cluster-stop",
        *("run", "--run-dir", str(run_dir), "--preset", "cpu_smoke", "--local-workers", "2"),
        *("--preemptions-per-hour", "0", "--validation-prompts", str(prompts)),
    )
    outlived = _processes_naming(str(run_dir))
    _kill_naming(str(run_dir))  # none should be left; if some are, they must not outlive the test
    assert not outlived, "a worker process outlived the stopped run"
    assert code == 1, stderr[-2000:]
    assert "spotlight run stopped: interrupted by Ctrl-C (SIGINT)" in stderr
    assert _ledger(run_dir, "SELECT status FROM runs") == [("interrupted",)]


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="lists processes through /proc")
def test_sigterm_while_local_workers_start_stops_the_run_and_its_workers_with_a_resume_hint(tmp_path, prompts):
    """SIGTERM outside Dagster's own handling (here: while the worker cluster starts) used to end the process at
    once, with no hint and no record of the stop."""
    run_dir = tmp_path / "terminated"
    proc = _spotlight(
        "run",
        "--run-dir",
        str(run_dir),
        "--preset",
        "cpu_smoke",
        "--local-workers",
        "1",
        "--preemptions-per-hour",
        "0",
        "--validation-prompts",
        str(prompts),
    )
    _wait_for_line(proc, "rollouts on 1 local spot workers", timeout_s=120)
    code, stderr = _stopped(proc, signal.SIGTERM)
    assert code == 1, stderr[-2000:]
    assert "spotlight run stopped: interrupted" in stderr
    assert HINT.format(run_dir) in " ".join(stderr.split())
    deadline = time.monotonic() + 30
    while _processes_naming(str(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _processes_naming(str(run_dir)), "a worker process outlived the stopped run"
    stored = yaml.safe_load((run_dir / "config.yaml").read_text())  # what --resume continues
    assert (stored["preset"], stored["deployment"]["rollouts"], stored["workers"]["local_workers"]) == (
        "cpu_smoke",
        "local_pool",
        1,
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda sig: sig.name)
def test_a_stop_signal_that_dagster_captured_and_cleared_is_still_seen_at_the_next_check(sig):
    """Dagster's capture_interrupts (around every in-process execution) holds both signals' handlers and forgets a
    signal that arrived outside a step when it exits; the run's check must still see it."""
    with StopSignals() as stop:
        with capture_interrupts():
            signal.raise_signal(sig)  # Dagster's handler: a flag only
        assert signal.getsignal(sig) == stop._handle  # Dagster put the run's handler back...
        with pytest.raises(RunInterrupted) as raised:
            stop.check()  # ...and forgot the signal; the check did not
        assert raised.value.signum == sig


def test_every_ctrl_c_raises_at_once_outside_dagster_and_the_handlers_come_back_after():
    """Outside Dagster's execution a stop signal stops the run at once, and so does a second one (it cuts the stop's
    clean-up short); afterwards the process's own handlers and wakeup fd are back."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    with StopSignals() as stop:
        for sig in (signal.SIGINT, signal.SIGINT, signal.SIGTERM):
            with pytest.raises(RunInterrupted) as raised:
                signal.raise_signal(sig)
            assert raised.value.signum == sig
        with pytest.raises(RunInterrupted):
            stop.check()  # the first stays the reason
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert signal.set_wakeup_fd(-1) == -1  # none was set before the block


def test_checks_without_a_stop_signal_let_the_run_go_on():
    """Other signals the process handles (pytest-timeout's SIGALRM, SIGCHLD) reach the wakeup fd too: no stop."""
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: seen.append(1))
    try:
        with StopSignals() as stop:
            signal.raise_signal(signal.SIGUSR1)
            stop.check()
            stop.check()
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert seen == [1]
