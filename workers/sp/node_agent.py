"""The node agent: one long-lived process per machine that owns CPU-side state and the device workers.

It keeps what must survive a change of capacity: the rendezvous store (a TCPStore it
owns; every group generation rendezvouses under a fresh prefix of it) and the device
workers (workers/sp/node_worker.py, one process each, holding the model). When a worker
is lost, added, or the SP degree should change for the queue's load, the agent re-forms
the groups (`form`): the survivors keep their weights and only rendezvous again.
Degree choice: workers/sp/degree.py. Design: docs/ELASTIC_SP.md.

Two ways to use it:

- **The product path** (`AgentConfig(store_url=...)`, no policy config): the workers hold
  no model until a queue request names its run; `python -m workers.sp`
  (workers/sp/node_serve.py) serves the queue with the rollout worker's own request code on
  the groups (workers/sp/node_requests.py), for the pixel policy or a diffusers family.
- **The pixel path** (`AgentConfig(policy_config=cfg, weights_key=...)`): every worker
  builds the pixel policy and loads one fixed weights commit; the agent keeps each
  request's committed SamplerState and the prompts' text encodings in memory
  (`run_requests`), and a joining worker copies a peer's weights through shared memory
  (`copy_from_peer`). `spotlight bench elastic` times it.

Example (the pixel path):
    agent = NodeAgent(AgentConfig(policy_config=cfg, store_url="runs/store", weights_key=key))
    a, b = agent.spawn(2); agent.load_from_store([a, b]); agent.form(degree=2)
    state = agent.sample(SPRequest("r0", "a red circle", seed=7, sampler=SamplerConfig()))
    c, = agent.spawn(1); agent.copy_from_peer(c); agent.form(degree=...)   # a worker joins
    agent.close()

Command line (the product path; heavy imports after argparse):
    python -m workers.sp --queue /runs/demo/queue.db --store /runs/demo/store --workers 2
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from workers.rollout.config import KNOBS
from workers.sp.node_groups import GroupRunner, SPRequest, state_from_wire
from workers.sp.node_worker import worker_main
from workers.sp.shared_weights import unlink_segment
from workers.sp.ulysses import allowed_degrees

__all__ = ["AgentConfig", "NodeAgent", "SPRequest"]


@dataclass(frozen=True)
class AgentConfig:
    policy_config: Any = None
    """The pixel policy's PolicyConfig (every worker builds the same skeleton); None: the product path, where
    workers hold no model until a request names its run (workers/sp/node_member.py)."""
    store_url: str = ""
    """Tensor store holding the weights (the naive path and the first worker read it; every product-path member)."""
    weights_key: str | None = None
    """Commit key of the pixel policy's weights (a tensor dict of its state_dict); None on the product path."""
    device: str = "cpu"
    """Product path: "cpu", or "cuda" (worker k of the node gets a GPU of its own, the lowest index free)."""
    commit_every: int = KNOBS.commit_every
    """Denoising steps between committed states of an in-flight request."""
    threads_per_worker: int = KNOBS.worker_threads
    """torch CPU threads of each device worker: part of a CPU member's kernel set (a group of one computes the bits of
    a rollout worker started with `--threads` of this count: docs/SPOT_RUNTIME.md)."""
    join_timeout_s: float = 120.0
    """Collective timeout of a group; a dead member is usually detected at once (connection reset)."""
    host: str = "127.0.0.1"
    """Address of the rendezvous store (workers are on this node)."""
    reply_timeout_s: float = 600.0
    """Longest wait for a live worker's answer (start-up imports take minutes on a saturated CPU);
    a worker that dies is noticed at once through its process sentinel, not by this timeout."""
    model: str | None = None
    """Product path: the diffusers pipeline folder this node serves (`--model`); a run on another one is refused
    with ModelMismatchError. None: whatever a run's anchor names."""

    def __post_init__(self):
        if not self.store_url:
            raise ValueError("store_url must name the tensor store the workers load weights from")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.policy_config is not None and self.weights_key is None:
            raise ValueError("a pixel-policy agent (policy_config set) needs the weights_key to load")
        if self.commit_every < 1:
            raise ValueError(f"commit_every must be >= 1, got {self.commit_every}")
        if self.threads_per_worker < 1:
            raise ValueError(f"threads_per_worker must be >= 1, got {self.threads_per_worker}")
        if self.reply_timeout_s <= 0:
            raise ValueError(f"reply_timeout_s must be > 0, got {self.reply_timeout_s}")
        if self.join_timeout_s <= 0:
            raise ValueError(f"join_timeout_s must be > 0, got {self.join_timeout_s}")


@dataclass
class ReformReport:
    """One re-formation of the node's groups, timed on the agent's clock."""

    generation: int
    degree: int
    groups: list[list[str]]
    total_s: float
    rendezvous_s: float
    """Leave + init_process_group + enable_parallelism + messaging: total_s - warmup_s."""
    warmup_s: float
    """The slowest worker's first forward at the new degree."""
    per_worker: dict[str, dict] = field(default_factory=dict)


class NodeAgent:
    def __init__(self, config: AgentConfig):
        import multiprocessing as mp

        import torch.distributed as dist

        self.config = config
        self._ctx = mp.get_context("spawn")
        self.store = dist.TCPStore(config.host, 0, is_master=True, wait_for_workers=False)
        self.workers: dict[str, Any] = {}
        """worker id -> _Handle of every live worker."""
        self.generation = 0
        self.groups: list[list[str]] = []
        self.weights_hash: str | None = None
        self.text_cache: dict[str, tuple] = {}
        self.committed: dict[str, dict] = {}
        """request id -> wire state of its last committed step."""
        self.latency_s: dict[int, float] = {}
        """Measured seconds per request at each degree (feeds the degree policy)."""
        self._next_id = 0
        self._segments = 0

    # ----- workers -----
    def spawn(self, count: int) -> list[str]:
        """Start `count` device workers and wait until each is ready (imports done, skeleton built)."""
        started = []
        for _ in range(count):
            wid = f"w{self._next_id}"
            self._next_id += 1
            parent, child = self._ctx.Pipe()
            product = self.config.policy_config is None
            cfg = None if product else asdict(self.config.policy_config)
            device = self._free_device()
            proc = self._ctx.Process(
                target=worker_main,
                name=f"spotlight-{wid}",
                daemon=True,
                args=(
                    child,
                    wid,
                    self.config.host,
                    self.store.port,
                    cfg,
                    self.config.threads_per_worker,
                    device,
                    self.config.store_url,
                    self.config.model,
                ),
            )
            proc.start()
            child.close()
            self.workers[wid] = _Handle(wid, proc, parent, self.config.reply_timeout_s, device)
            self.workers[wid].loaded = product  # a product-path member loads each request's weights itself
            started.append(wid)
        for wid in started:
            self.workers[wid].expect("ready")
        return started

    def _free_device(self) -> str:
        """CPU, or the lowest-numbered GPU no live worker holds (one worker per GPU)."""
        if self.config.device == "cpu":
            return "cpu"
        import torch

        taken = {h.device for h in self.workers.values() if h.proc.is_alive()}
        free = [f"cuda:{i}" for i in range(torch.cuda.device_count()) if f"cuda:{i}" not in taken]
        if not free:
            raise RuntimeError(f"every one of the {torch.cuda.device_count()} GPUs already has a worker")
        return free[0]

    def load_from_store(self, worker_ids: list[str]) -> float:
        """Naive weights: each worker reads the tensor store. Returns the wall seconds."""
        t0 = time.perf_counter()
        for wid in worker_ids:
            self.workers[wid].send(
                {"op": "load_store", "store_url": self.config.store_url, "key": self.config.weights_key}
            )
        hashes = {self.workers[wid].expect("load_store")["hash"] for wid in worker_ids}
        self._check_hashes(hashes)
        return time.perf_counter() - t0

    def copy_from_peer(self, worker_id: str, peer: str | None = None) -> float:
        """Elastic weights: copy a loaded peer's weights through shared memory; hash-checked."""
        peer = peer or next(w for w in self.workers if w != worker_id and self.workers[w].loaded)
        t0 = time.perf_counter()
        self._segments += 1
        name = f"spotlight-agent{self.store.port}-{self._segments}"
        self.workers[peer].send({"op": "export", "name": name, "weights_hash": self.weights_hash})
        shared = self.workers[peer].expect("export")["shared"]
        try:
            self.workers[worker_id].send({"op": "import", "shared": shared})
            self._check_hashes({self.workers[worker_id].expect("import")["hash"]})
        finally:
            unlink_segment(shared.segment)
        return time.perf_counter() - t0

    def kill(self, worker_id: str) -> None:
        """Kill a worker as a spot preemption would (SIGKILL); the agent notices on its next wait."""
        handle = self.workers[worker_id]
        handle.proc.kill()
        handle.proc.join(timeout=10)

    def live_loaded(self) -> list[str]:
        return [w for w, h in self.workers.items() if h.proc.is_alive() and h.loaded]

    def forget_dead(self) -> list[str]:
        """Drop workers whose process has exited; returns their ids."""
        dead = [w for w, h in self.workers.items() if not h.proc.is_alive()]
        for wid in dead:
            self.workers.pop(wid).close()
        return dead

    # ----- groups -----
    def form(self, degree: int | None = None) -> ReformReport:
        """Re-form every live, loaded worker into groups of `degree` (default: the largest that fits)."""
        self.forget_dead()
        ids = self.live_loaded()
        if not ids:
            raise RuntimeError("no live worker with weights: spawn and load one first")
        fits = (
            list(range(1, len(ids) + 1))
            if self.config.policy_config is None  # the request decides (probe)
            else allowed_degrees(self.config.policy_config, len(ids))
        )
        degree = degree or fits[-1]
        if degree not in fits:
            raise ValueError(f"degree {degree} is not possible with {len(ids)} workers (possible: {fits})")
        self.generation += 1
        groups = [ids[i : i + degree] for i in range(0, len(ids) - degree + 1, degree)]
        t0 = time.perf_counter()
        for g, members in enumerate(groups):
            for rank, wid in enumerate(members):
                self.workers[wid].send(
                    {
                        "op": "join",
                        "prefix": f"gen{self.generation}/g{g}",
                        "rank": rank,
                        "world_size": degree,
                        "timeout_s": self.config.join_timeout_s,
                    }
                )
        replies = {wid: self.workers[wid].expect("join") for members in groups for wid in members}
        total = time.perf_counter() - t0
        self.groups = groups
        warm = max(r["warmup_s"] for r in replies.values())
        return ReformReport(self.generation, degree, groups, total, total - warm, warm, replies)

    # ----- requests -----
    def run_requests(
        self,
        requests: list[SPRequest],
        on_dispatch: Callable[[str, int], None] | None = None,
        degree_after_loss: Callable[[int], int | None] | None = None,
    ) -> dict[str, Any]:
        """Sample every request on the current groups; re-form and resume when workers are lost.

        Returns request id -> final SamplerState. on_dispatch(request_id, step) runs after
        each chunk is sent (tests use it to kill a worker mid-request).
        """
        if self.config.policy_config is None:
            raise RuntimeError(
                "run_requests is the pixel path; the product path serves queue requests with "
                "workers.sp.node_requests.RequestServer"
            )
        runner = GroupRunner(self, on_dispatch)
        while True:
            finished = runner.run(requests)
            if finished:
                return {rid: state_from_wire(self.committed[rid]) for rid in (r.request_id for r in requests)}
            self.forget_dead()
            live = len(self.live_loaded())
            choice = degree_after_loss(live) if degree_after_loss else None
            self.form(choice)

    def sample(self, request: SPRequest, **kwargs):
        return self.run_requests([request], **kwargs)[request.request_id]

    def close(self) -> None:
        """Stop every worker (kill those that do not exit) and release the store."""
        for handle in list(self.workers.values()):
            handle.stop()
        self.workers.clear()
        self.store = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _check_hashes(self, hashes: set[str]) -> None:
        if self.weights_hash is not None:
            hashes = hashes | {self.weights_hash}
        if len(hashes) != 1:
            raise RuntimeError(f"workers hold different weights: hashes {sorted(hashes)}")
        self.weights_hash = hashes.pop()


class _Handle:
    """The agent's side of one worker: process, pipe and what it has done."""

    def __init__(self, worker_id: str, proc, conn, timeout_s: float = 600.0, device: str = "cpu"):
        self.worker_id, self.proc, self.conn, self.timeout_s = worker_id, proc, conn, timeout_s
        self.device = device
        self.loaded = False

    def send(self, msg: dict) -> None:
        self.conn.send(msg)

    def expect(self, op: str, timeout_s: float | None = None) -> dict:
        """The next reply, which must be `op`; raises if the worker died or answered otherwise."""
        from multiprocessing.connection import wait

        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        if not wait([self.conn, self.proc.sentinel], timeout=timeout_s) or not self.conn.poll():
            raise RuntimeError(f"worker {self.worker_id} died or did not answer {op!r} in {timeout_s} s")
        reply = self.conn.recv()
        if reply["op"] != op:
            raise RuntimeError(f"worker {self.worker_id} answered {reply} to {op!r}")
        if op in ("load_store", "import"):
            self.loaded = True
        return reply

    def stop(self) -> None:
        try:
            self.conn.send({"op": "stop"})
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(timeout=10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()
        self.close()

    def close(self) -> None:
        self.conn.close()
