"""The rollout worker: resumable requests, SIGTERM / SIGKILL recovery, cloud notices, clear start-up errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from resources.keys import rollout_key, rollout_state_key
from resources.queue import open_queue
from resources.queue.records import Request
from tests.hooks import stop_after
from tests.paths import REPO_ROOT
from tests.procs import ProcessLines
from workers.algo.sampler import SamplerConfig
from workers.rollout.request import StepHooks, work_request
from workers.rollout.state import RolloutSpec, rollout_request
from workers.rollout.weights import PolicyHolder

REPO = REPO_ROOT
SPEC = RolloutSpec("demo", "two red circles", 11, 0, SamplerConfig(num_steps=8, sde_window=(0, 4)))


def _request(rid: str = "r0", spec: RolloutSpec = SPEC) -> Request:
    return Request.from_dict(rollout_request(rid, 0, spec))


def test_an_uninterrupted_request_commits_its_trajectory_reward_and_hash(rollout_store) -> None:
    out = work_request(_request(), 1, rollout_store, PolicyHolder(rollout_store), worker_id="w0", commit_every=2)
    assert out.status == "done" and out.step == 8 and out.won
    result = rollout_store.load_tensors(out.result_key)
    assert tuple(result["latents"].shape) == (9, 3, 16, 16) and tuple(result["image"].shape) == (16, 16, 3)
    meta = rollout_store.read_manifest(out.result_key).metadata
    assert meta["result_hash"] == out.result_hash and meta["seed"] == 11 and meta["worker_id"] == "w0"
    assert rollout_store.list_keys(rollout_state_key("demo", "r0") + "/") == []  # in-flight state cleaned up


@pytest.mark.parametrize("checks,commit_every", [(1, 4), (3, 2), (5, 100), (7, 3)])
def test_a_request_stopped_midway_and_resumed_on_another_worker_is_bit_identical(
    rollout_store, checks, commit_every
) -> None:
    reference = work_request(
        _request("ref"), 1, rollout_store, PolicyHolder(rollout_store), worker_id="w0", commit_every=8
    )
    first = work_request(
        _request("r1"),
        1,
        rollout_store,
        PolicyHolder(rollout_store),
        worker_id="w1",
        commit_every=commit_every,
        hooks=StepHooks(should_stop=stop_after(checks)),
    )
    assert first.status == "preempted" and first.step == first.committed_step == checks
    second = work_request(
        _request("r1"), 2, rollout_store, PolicyHolder(rollout_store), worker_id="w2", commit_every=commit_every
    )
    assert second.resumed_from_step == checks and second.step == 8
    assert second.result_hash == reference.result_hash
    history = rollout_store.read_manifest(second.result_key).metadata["attempts"]
    assert [(a["worker_id"], a["resumed_from_step"], a["committed_step"]) for a in history] == [
        ("w1", 0, checks),
        ("w2", checks, 8),
    ]


def test_a_worker_killed_without_notice_loses_only_the_steps_since_its_last_commit(rollout_store) -> None:
    class Killed(Exception):
        pass

    def kill_at_step_5(flight) -> None:
        if flight.step == 5:
            raise Killed

    with pytest.raises(Killed):
        work_request(
            _request(),
            1,
            rollout_store,
            PolicyHolder(rollout_store),
            worker_id="w1",
            commit_every=2,
            hooks=StepHooks(after_step=kill_at_step_5),
        )
    again = work_request(_request(), 2, rollout_store, PolicyHolder(rollout_store), worker_id="w2", commit_every=2)
    assert again.resumed_from_step == 4  # step 5 was computed but never committed


def test_a_finished_request_claimed_again_is_not_recomputed(rollout_store) -> None:
    first = work_request(_request(), 1, rollout_store, PolicyHolder(rollout_store), worker_id="w1", commit_every=2)
    again = work_request(_request(), 2, rollout_store, PolicyHolder(rollout_store), worker_id="w2", commit_every=2)
    assert again.status == "already_done" and again.result_hash == first.result_hash and again.compute_s == 0


def test_a_worker_whose_lease_was_lost_stops_without_committing(rollout_store) -> None:
    out = work_request(
        _request(),
        1,
        rollout_store,
        PolicyHolder(rollout_store),
        worker_id="w1",
        commit_every=1,
        hooks=StepHooks(lease_lost=lambda: True),
    )
    assert out.status == "lost" and rollout_store.list_keys(rollout_state_key("demo", "r0") + "/") == []


def test_state_left_by_a_different_request_under_the_same_id_is_never_resumed(rollout_store) -> None:
    work_request(
        _request(),
        1,
        rollout_store,
        PolicyHolder(rollout_store),
        worker_id="w1",
        commit_every=2,
        hooks=StepHooks(should_stop=stop_after(2)),
    )
    other = RolloutSpec("demo", "two red circles", 12, 0, SPEC.sampler)
    out = work_request(
        _request("r0", other), 2, rollout_store, PolicyHolder(rollout_store), worker_id="w2", commit_every=2
    )
    reference = work_request(
        _request("ref", other), 1, rollout_store, PolicyHolder(rollout_store), worker_id="w0", commit_every=8
    )
    assert out.resumed_from_step == 0 and out.result_hash == reference.result_hash


@pytest.mark.parametrize(
    "payload,message",
    [
        ({"run": "demo", "prompt": "a red circle", "seed": 1}, "missing fields"),
        ({**SPEC.to_payload(), "seed": -1}, "seed"),
        ({**SPEC.to_payload(), "prompt": "a red dragon"}, "unknown word"),
        ({**SPEC.to_payload(), "reward": "nope"}, "unknown reward"),
        ({**SPEC.to_payload(), "sampler": {"num_steps": 0}}, "num_steps"),
    ],
)
def test_a_malformed_request_fails_before_any_compute(rollout_store, payload, message) -> None:
    request = Request("bad", 0, "rollout", payload)
    with pytest.raises(ValueError, match=message):
        work_request(request, 1, rollout_store, PolicyHolder(rollout_store), worker_id="w", commit_every=2)


def test_an_exploration_request_in_words_the_pixel_policy_does_not_know_is_refused_before_sampling(rollout_store):
    from workers.explore.request import ExploreSpec, work_explore_request

    spec = ExploreSpec("demo", "a red dragon", (1, 2), 0, SPEC.sampler)  # free text passes the payload check
    with pytest.raises(ValueError, match="unknown word"):
        work_explore_request(
            Request("e0", 0, "explore", spec.to_payload()), rollout_store, PolicyHolder(rollout_store), worker_id="w"
        )


def test_a_worker_reaches_a_newer_version_through_pulse_patches(tmp_store, tiny_policy) -> None:
    import torch

    from workers.rollout.weights import publish_policy

    publisher = publish_policy(tmp_store, "demo", tiny_policy)
    with torch.no_grad():
        next(tiny_policy.parameters()).add_(0.5)
    publisher.publish(1, tiny_policy.state_dict())
    holder = PolicyHolder(tmp_store)
    holder.policy_at("demo", 0)
    at_1 = holder.policy_at("demo", 1)  # patch 1 applied, hash checked
    expected = next(tiny_policy.parameters()).detach().to(torch.bfloat16).float()
    assert torch.equal(next(at_1.parameters()), expected)


# --- the worker process ------------------------------------------------------------------


_STARTED: list[ProcessLines] = []


@pytest.fixture(autouse=True)
def _no_worker_outlives_its_test():
    yield
    while _STARTED:
        _STARTED.pop().__exit__()


def _start_worker(tmp_path: Path, store, *extra: str) -> ProcessLines:
    command = [
        sys.executable,
        "-m",
        "workers.rollout",
        "--queue",
        str(tmp_path / "queue.db"),
        "--store",
        str(store.root),
        "--threads",
        "1",
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    _STARTED.append(
        ProcessLines(
            subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        )
    )
    return _STARTED[-1]


def _events_until_exit(worker: ProcessLines, timeout_s: float = 60.0) -> list[dict]:
    rest, err = worker.finish(timeout_s)
    assert worker.proc.returncode == 0, err
    return [json.loads(line) for line in rest]


def test_sigterm_commits_the_state_at_once_gives_the_request_back_and_exits_cleanly(tmp_path, rollout_store) -> None:
    queue = open_queue(tmp_path / "queue.db")
    queue.put([rollout_request("r0", 0, SPEC)])
    worker = _start_worker(
        tmp_path, rollout_store, "--worker-id", "w1", "--commit-every", "100", "--step-delay-s", "0.3"
    )
    worker.wait_for_json(lambda e: e["event"] == "step" and e["step"] >= 2, timeout_s=120, what="step 2")
    worker.proc.send_signal(signal.SIGTERM)
    events = _events_until_exit(worker)
    preempted = next(e for e in events if e["event"] == "preempted")
    assert preempted["committed_step"] == preempted["step"] >= 2  # nothing lost
    assert events[-1]["event"] == "exit"
    lease = queue.claim("w2", lease_s=30)  # released at once: no wait for the lease to expire
    assert lease is not None and lease.attempts == 2
    out = work_request(
        lease.request, lease.attempts, rollout_store, PolicyHolder(rollout_store), worker_id="w2", commit_every=2
    )
    reference = work_request(
        _request("ref"), 1, rollout_store, PolicyHolder(rollout_store), worker_id="w0", commit_every=8
    )
    assert out.resumed_from_step == preempted["step"] and out.result_hash == reference.result_hash


def test_after_sigkill_the_lease_expires_and_another_worker_resumes_from_the_last_commit(
    tmp_path, rollout_store
) -> None:
    queue = open_queue(tmp_path / "queue.db")
    queue.put([rollout_request("r0", 0, SPEC)])
    worker = _start_worker(
        tmp_path, rollout_store, "--worker-id", "w1", "--commit-every", "2", "--step-delay-s", "0.3", "--lease-s", "4"
    )
    worker.wait_for_json(
        lambda e: e["event"] == "commit" and e["step"] == 4, timeout_s=120, what="the commit of step 4"
    )
    worker.proc.kill()
    worker.finish(timeout_s=30)
    assert queue.claim("w2", lease_s=30) is None  # still leased to the dead worker
    deadline = time.monotonic() + 60
    while (lease := queue.claim("w2", lease_s=30)) is None:  # until the dead worker's lease expires
        assert time.monotonic() < deadline, "the killed worker's 4 s lease did not expire within 60 s"
        time.sleep(0.1)
    assert lease is not None and lease.attempts == 2
    out = work_request(
        lease.request, lease.attempts, rollout_store, PolicyHolder(rollout_store), worker_id="w2", commit_every=2
    )
    reference = work_request(
        _request("ref"), 1, rollout_store, PolicyHolder(rollout_store), worker_id="w0", commit_every=8
    )
    assert out.resumed_from_step == 4 and out.result_hash == reference.result_hash
    assert queue.ack(lease, out.result_key)


def test_a_worker_drains_the_queue_and_exits_when_idle(tmp_path, rollout_store) -> None:
    queue = open_queue(tmp_path / "queue.db")
    queue.put([rollout_request(f"r{i}", 0, RolloutSpec("demo", "a blue square", i, 0, SPEC.sampler)) for i in range(3)])
    worker = _start_worker(tmp_path, rollout_store, "--worker-id", "w1", "--max-idle-s", "0.3")
    events = _events_until_exit(worker, timeout_s=60)
    assert sorted(e["request_id"] for e in events if e["event"] == "acked") == ["r0", "r1", "r2"]
    assert queue.results(["r0", "r1", "r2"]) == {f"r{i}": rollout_key("demo", 0, f"r{i}") for i in range(3)}


@pytest.mark.parametrize(
    "queue_url,store_url,message",
    [
        ("redis://127.0.0.1:1/0", "STORE", "cannot use the queue"),
        ("ftp://host/q", "STORE", "unsupported queue URL scheme"),
        ("QUEUE", "gs://bucket/x", "cannot use the tensor store"),
    ],
)
def test_an_unusable_queue_or_store_stops_the_worker_with_a_clear_error(
    tmp_path, queue_url, store_url, message
) -> None:
    queue_url = queue_url.replace("QUEUE", str(tmp_path / "q.db"))
    store_url = store_url.replace("STORE", str(tmp_path / "store"))
    done = subprocess.run(
        [sys.executable, "-m", "workers.rollout", "--queue", queue_url, "--store", store_url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_bad_flags_are_refused_naming_the_flag(tmp_path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.rollout",
            "--queue",
            str(tmp_path / "q.db"),
            "--store",
            str(tmp_path / "s"),
            "--commit-every",
            "0",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--commit-every" in done.stderr


def test_help_answers_without_importing_torch() -> None:
    code = (
        "import sys, runpy; sys.argv=['x','--help']\ntry: runpy.run_module('workers.rollout', run_name='__main__')\n"
        "except SystemExit: pass\nprint('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert "--commit-every" in done.stdout and done.stdout.strip().endswith("False")


def test_a_worker_stops_when_the_process_that_started_it_is_gone(tmp_path, rollout_store) -> None:
    """A local cluster passes --parent-pid: when the run that started the workers dies (even by SIGKILL, which no
    clean-up survives), they stop instead of polling a queue no one reads, holding their memory, for ever."""
    starter = (
        "import os, subprocess, sys\n"
        "worker = subprocess.Popen([sys.executable, '-m', 'workers.rollout', '--queue', sys.argv[1], '--store', "
        "sys.argv[2], '--threads', '1', '--worker-id', 'w1', '--parent-pid', str(os.getpid())], "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(worker.pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", starter, str(tmp_path / "queue.db"), str(rollout_store.root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == -9, done.stderr  # the starter was SIGKILLed, as a killed run is
    pid = int(done.stdout.split()[0])

    def alive() -> bool:
        status = Path(f"/proc/{pid}/status")
        try:
            return "\nState:\tZ" not in status.read_text()  # a zombie has exited
        except OSError:
            return False

    deadline = time.monotonic() + 90
    while alive():
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            pytest.fail("the worker kept running 90 s after the process that started it was killed")
        time.sleep(0.5)
