"""A request resumed on a worker of another kernel set (docs/SPOT_RUNTIME.md, "What bit-identical covers"): two rollout
worker processes whose torch kernels are forced to different vector ISAs with ATEN_CPU_CAPABILITY, one queue; and a
duplicate result with another hash, checked against the contract of the kernel sets that computed it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch

from resources.cluster.ledger import WorkTracker, result_records
from resources.keys import rollout_key
from resources.queue import open_queue
from resources.queue.records import Request
from resources.store.local import LocalTensorStore
from tests.paths import REPO_ROOT
from tests.procs import ProcessLines
from workers.algo.sampler import SamplerConfig
from workers.rollout.kernels import MIXED_KERNELS_ATOL, trajectory_drift
from workers.rollout.request import StepHooks, work_request
from workers.rollout.state import RolloutSpec, rollout_request, trajectory_hash
from workers.rollout.weights import PolicyHolder, publish_policy

SPEC = RolloutSpec("demo", "two red circles", 11, 0, SamplerConfig(num_steps=8, sde_window=(0, 4)))


def _kernel_isa(capability: str) -> str:
    """The vector ISA torch's kernels use in a process started with ATEN_CPU_CAPABILITY=capability (a CPU without
    it, or another architecture, falls back to what it has)."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": capability}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()


def _worker(tmp_path, store, capability: str, worker_id: str) -> ProcessLines:
    command = [sys.executable, "-m", "workers.rollout", "--queue", str(tmp_path / "queue.db"), "--store"]
    command += [str(store.root), "--threads", "1", "--worker-id", worker_id, "--commit-every", "2"]
    command += ["--step-delay-s", "0.3", "--max-idle-s", "1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": capability}
    proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return ProcessLines(proc)


def _events(worker: ProcessLines, seen: list[dict], until) -> None:
    """Every event up to the first `until` accepts, appended to `seen`."""

    def keep(event: dict) -> bool:
        seen.append(event)
        return until(event)

    worker.wait_for_json(keep, timeout_s=240, what="the worker's events")


def _rest(worker: ProcessLines, seen: list[dict]) -> None:
    rest, err = worker.finish(timeout_s=120)
    assert worker.proc.returncode == 0, err
    seen.extend(json.loads(line) for line in rest)


def test_a_request_resumed_on_another_kernel_set_is_recorded_as_mixed_and_held_to_the_stated_tolerance(
    tmp_path, rollout_store, mem_ledger
) -> None:
    # ref-avx2 and ref-default are the same request (one fingerprint) sampled uninterrupted on each kernel set;
    # r0 is started on AVX2 kernels, stopped by a SIGTERM after its step-4 commit, and finished on DEFAULT ones.
    isa = {capability: _kernel_isa(capability) for capability in ("avx2", "default")}
    if isa["avx2"] == isa["default"]:
        pytest.skip(f"this CPU offers torch one kernel set here ({isa['avx2']}): nothing to resume across")
    names = ("ref-avx2", "r0", "ref-default")
    with open_queue(tmp_path / "queue.db") as queue:
        queue.put([rollout_request(rid, 0, SPEC) for rid in names])
    events: list[dict] = []
    with _worker(tmp_path, rollout_store, "avx2", "w-avx2") as first:
        _events(first, events, lambda e: (e["event"], e.get("request_id"), e.get("step")) == ("commit", "r0", 4))
        first.proc.send_signal(signal.SIGTERM)
        _rest(first, events)
    with _worker(tmp_path, rollout_store, "default", "w-default") as second:
        _rest(second, events)

    results = {rid: rollout_store.read_manifest(rollout_key("demo", 0, rid)).metadata for rid in names}
    kernels = {rid: [name.split(",")[0] for name in meta["kernel_sets"]] for rid, meta in results.items()}
    avx2, default = isa["avx2"], isa["default"]
    assert kernels == {"ref-avx2": [avx2], "r0": [avx2, default], "ref-default": [default]}
    assert [results[rid]["mixed_kernels"] for rid in names] == [False, True, False]
    resumed = results["r0"]["resumed_from_step"]
    assert resumed >= 4 and [a["worker_id"] for a in results["r0"]["attempts"]] == ["w-avx2", "w-default"]

    # The contract: one kernel set gives the same bits; across kernel sets, the same request within the tolerance.
    got, ref_avx2, ref_default = (rollout_store.load_tensors(rollout_key("demo", 0, rid)) for rid in names)
    assert torch.equal(got["latents"][: resumed + 1], ref_avx2["latents"][: resumed + 1]), "AVX2's steps are AVX2's"
    assert trajectory_drift(got, ref_avx2) <= MIXED_KERNELS_ATOL
    assert trajectory_drift(got, ref_default) <= MIXED_KERNELS_ATOL

    # The ledger, written from the workers' events as the local cluster writes it.
    tracker = WorkTracker(mem_ledger)
    for worker_id in ("w-avx2", "w-default"):
        tracker.worker_started(
            worker_id, role="rollout", instance_type="local-cpu", spot=True, usd_per_hour=0.0, gpu_type=None, at=0.0
        )
    for event in events:
        tracker.on_event(event)
    mem_ledger.record_requests(result_records(rollout_store, [rollout_request(rid, 0, SPEC) for rid in names]))
    workers = mem_ledger.query("SELECT worker_id, device_type, kernel_set FROM workers ORDER BY worker_id").as_dicts()
    assert [(w["device_type"], w["kernel_set"].split(",")[0]) for w in workers] == [("cpu", avx2), ("cpu", default)]
    rows = mem_ledger.query("SELECT request_id, mixed_kernels, kernel_sets FROM requests ORDER BY request_id")
    assert [(r["request_id"], r["mixed_kernels"], len(json.loads(r["kernel_sets"]))) for r in rows.as_dicts()] == [
        ("r0", True, 2),
        ("ref-avx2", False, 1),
        ("ref-default", False, 1),
    ]


class RacingStore(LocalTensorStore):
    """The same folder, but just before this worker commits a result, another worker commits that result as
    `theirs(tensors, metadata)` makes it (two workers finishing one request, the other first)."""

    def __init__(self, root, theirs) -> None:
        super().__init__(root)
        self.theirs = theirs

    def publish_tensors(self, commit_key, tensors, metadata=None, *, exclusive=False):
        if exclusive and self.theirs is not None:
            theirs, self.theirs = self.theirs, None
            super().publish_tensors(commit_key, *theirs(dict(tensors), dict(metadata)), exclusive=True)
        return super().publish_tensors(commit_key, tensors, metadata, exclusive=exclusive)


@pytest.mark.parametrize(
    ("their_kernels", "shift", "reported"),
    [
        (None, 1e-6, "hash_mismatch"),  # one kernel set: any other bit breaks determinism
        (["AVX2, 1 threads, torch 2.13.0+cpu"], 1e-3, "kernel_drift"),  # another kernel set, within the tolerance
        (["AVX2, 1 threads, torch 2.13.0+cpu"], 0.1, "hash_mismatch"),  # another kernel set, beyond it
    ],
)
def test_a_duplicate_result_with_another_hash_is_checked_against_the_contract_of_its_kernel_sets(
    tmp_path, tiny_policy, their_kernels, shift, reported
) -> None:
    def theirs(tensors, meta):
        latents = tensors["latents"] + shift
        meta = {**meta, "result_hash": trajectory_hash(latents, tensors["log_probs"])}
        if their_kernels is not None:
            meta.update(kernel_sets=their_kernels, mixed_kernels=False)
        return {**tensors, "latents": latents}, meta

    store = RacingStore(tmp_path / "store", theirs)
    publish_policy(store, "demo", tiny_policy)
    events = []
    out = work_request(
        Request.from_dict(rollout_request("r0", 0, SPEC)),
        2,
        store,
        PolicyHolder(store),
        worker_id="w2",
        commit_every=8,
        hooks=StepHooks(report=lambda event, **fields: events.append({"event": event, **fields})),
    )
    assert out.status == "done" and not out.won
    (checked,) = [e for e in events if e["event"] in ("kernel_drift", "hash_mismatch")]
    assert checked["event"] == reported and checked["committed"] != checked["ours"]
    if reported == "kernel_drift":
        assert checked["drift"] == pytest.approx(shift, rel=1e-3)
