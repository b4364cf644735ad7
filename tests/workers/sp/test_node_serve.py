"""The node agent's product path: queue requests of a Qwen-Image run sampled on SP groups with the rollout worker's
own request code (workers/sp/node_serve.py, node_requests.py, group_policy.py, node_member.py).

The reference is the rollout worker's `work_request` in this process, on a second store holding the same run.
Tolerances: a group of one computes the bits of a rollout worker with its members' thread count (equal result hashes,
under every CPU capability: tiny_run.py); a group of two matches to
SP_ATOL = 1e-5 (fp32 forwards; measured 1.2e-6 on the latents): Ulysses' all-to-all and the padded negative prompt
change the order of floating-point sums, never the noise.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from resources.keys import rollout_state_key
from resources.queue.records import Request
from resources.store.local import LocalTensorStore
from tests.paths import REPO_ROOT
from tests.workers.sp.tiny_run import RUN, rollout_worker_results, tiny_run
from workers.rollout.state import RolloutSpec

SP_ATOL = 1e-5


def test_a_group_of_one_commits_what_the_rollout_worker_commits_bit_for_bit(tmp_path, qwen4):
    from workers.rollout.request import work_request
    from workers.sp.group_policy import GroupChannel, GroupHolder
    from workers.sp.node_agent import AgentConfig, NodeAgent

    ref, sp = LocalTensorStore(tmp_path / "ref"), LocalTensorStore(tmp_path / "sp")
    run = tiny_run(qwen4, [ref, sp], num_requests=1)
    want = rollout_worker_results(ref, run.requests)["r0"]
    with NodeAgent(AgentConfig(store_url=sp.url)) as agent:
        (wid,) = agent.spawn(1)
        agent.form(1)
        channel = GroupChannel([agent.workers[wid]])
        got = work_request(
            Request.from_dict(run.requests[0]), 1, sp, GroupHolder(channel), worker_id="node/w0", commit_every=2
        )
        loaded = channel.call({"op": "status"})["loaded"]
        with pytest.raises(ValueError, match="resolution 36 must be a multiple of 8"):  # the member's error, typed
            GroupHolder(channel).policy_for(
                dataclasses.replace(RolloutSpec.from_payload(run.requests[0]["payload"]), resolution=36)
            )
    assert got.status == "done" and got.result_key == want
    assert got.result_hash == ref.read_manifest(want).metadata["result_hash"]
    assert loaded == ["vae"], "the member read the prompt embeddings from the store: no text encoder"


def test_a_node_started_for_another_model_gives_the_request_back_and_stops(tmp_path, qwen4):
    """As a rollout worker started with --model does: every request of that run would fail on this node."""
    from resources.queue import open_queue
    from workers.sp.node_agent import AgentConfig, NodeAgent
    from workers.sp.node_requests import RequestServer, ServeConfig

    sp = LocalTensorStore(tmp_path / "sp")
    run = tiny_run(qwen4, [sp], num_requests=1)
    events, stop = [], threading.Event()
    config = AgentConfig(store_url=sp.url, model=str(tmp_path / "another-model"))
    with open_queue(tmp_path / "queue.db") as queue, NodeAgent(config) as agent:
        agent.spawn(1)
        server = RequestServer(
            agent, queue, sp, lambda event, **f: events.append({"event": event, **f}), ServeConfig("n0"), stop
        )
        queue.put(run.requests)
        server.serve([queue.claim("n0", 60.0)])
        assert queue.stats().pending == 1 and not _of(events, "acked")
    assert server.misconfigured and stop.is_set()
    assert "ModelMismatchError" in _of(events, "failed")[0]["error"]


@pytest.mark.slow  # the node agent and two device workers as processes (~40 s here)
def test_a_node_serving_a_queue_on_a_group_of_two_survives_losing_a_member(tmp_path, qwen4):
    from resources.queue import open_queue

    ref, sp = LocalTensorStore(tmp_path / "ref"), LocalTensorStore(tmp_path / "sp")
    run = tiny_run(qwen4, [ref, sp], num_requests=3)
    want = rollout_worker_results(ref, run.requests)
    with open_queue(tmp_path / "queue.db") as queue:
        queue.put(run.requests)
    rc, events = _serve(tmp_path, _kill_at("w1", after=("commit", "r1")), "--degree", "2")
    assert rc == 0, events[-3:]
    assert [(e["degree"], e["groups"]) for e in _of(events, "formed")] == [(2, [["w0", "w1"]]), (1, [["w0"]])]
    assert [(e["request_id"], e["dead"]) for e in _of(events, "group_lost")] == [("r1", ["w1"])]
    assert [e["resumed_from_step"] for e in _of(events, "claim") if e["request_id"] == "r1"] == [0, 2]
    for rid in ("r0", "r1"):  # sampled by the group of two (r1: steps 0-2; then w0 alone resumed it)
        _assert_close(sp, ref, want[rid])
    assert _hash(sp, want["r2"]) == _hash(ref, want["r2"]), "a group of one must compute the rollout worker's bits"
    with open_queue(tmp_path / "queue.db") as queue:
        assert queue.results(want) == want and not queue.dead_letters()
    assert all(sp.list_commits(rollout_state_key(RUN, rid) + "/") == [] for rid in want)
    assert _of(events, "exit")[0]["loaded"] == {"w0": ["vae"]}, "no member loaded a text encoder"


@pytest.mark.slow  # the node agent and two device workers as processes (~35 s here)
def test_a_sigterm_to_the_nodes_process_group_commits_in_flight_state_and_exits_with_the_notice_code(tmp_path, qwen4):
    """A spot preemption signals the whole job: the device workers must outlive the step so the agent commits it."""
    from resources.queue import open_queue

    run = tiny_run(qwen4, [LocalTensorStore(tmp_path / "sp")], num_requests=1)
    with open_queue(tmp_path / "queue.db") as queue:
        queue.put(run.requests)

    def preempt(event, pids, proc):
        if (event["event"], event.get("request_id"), event.get("step")) == ("step", "r0", 1):
            os.killpg(proc.pid, signal.SIGTERM)  # the agent, its workers and their pipes: one process group

    rc, events = _serve(tmp_path, preempt, "--degree", "2", "--commit-every", "3", "--notice-exit-code", "75")
    assert rc == 75, events[-3:]
    (stopped,) = _of(events, "preempted")
    assert stopped["committed_step"] == stopped["step"] >= 1 and not _of(events, "group_lost")
    assert _of(events, "exit")[0]["reason"] == "stopped"
    assert LocalTensorStore(tmp_path / "sp").list_commits(rollout_state_key(RUN, "r0") + "/"), "no state committed"
    with open_queue(tmp_path / "queue.db") as queue:
        assert queue.stats().pending == 1, "the request was given back"


def _kill_at(victim: str, after: tuple[str, str]):
    """SIGKILL worker `victim` when the event `after` = (event, request id) appears."""

    def act(event, pids, proc):
        if (event["event"], event.get("request_id")) == after:
            os.kill(pids[victim], signal.SIGKILL)

    return act


def _serve(tmp_path: Path, act, *flags: str) -> tuple[int, list[dict]]:
    """Run `python -m workers.sp` on 2 workers from a folder outside the checkout; act(event, worker pids, process) on
    each event. 0.5 s per step keeps an action inside the request it waits for."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert REPO_ROOT not in elsewhere.resolve().parents
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    args = [
        sys.executable,
        "-m",
        "workers.sp",
        "--queue",
        str(tmp_path / "queue.db"),
        "--store",
        str(tmp_path / "sp"),
        "--workers",
        "2",
        "--max-idle-s",
        "2",
        "--node-id",
        "n0",
        "--step-delay-s",
        "0.5",
        *flags,
    ]
    proc = subprocess.Popen(
        args,
        cwd=elsewhere,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    guard = threading.Timer(240, lambda: os.killpg(proc.pid, signal.SIGKILL))  # a hang fails before pytest-timeout
    guard.start()
    events, pids = [], {}
    try:
        for line in proc.stdout:
            event = json.loads(line)
            events.append(event)
            pids = event.get("workers", pids) if event["event"] == "ready" else pids
            act(event, pids, proc)
        return proc.wait(), events
    finally:
        guard.cancel()


def _of(events: list[dict], name: str) -> list[dict]:
    return [e for e in events if e["event"] == name]


def _hash(store, key: str) -> str:
    return store.read_manifest(key).metadata["result_hash"]


def _assert_close(got_store, want_store, key: str) -> None:
    got, want = got_store.load_tensors(key), want_store.load_tensors(key)
    got_meta, want_meta = got_store.read_manifest(key).metadata, want_store.read_manifest(key).metadata
    assert got_meta["fingerprint"] == want_meta["fingerprint"] and set(got_meta) == set(want_meta)
    for name in ("latents", "log_probs"):
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=SP_ATOL, equal_nan=True)
