"""A device worker of the node agent: one process per device, holding one copy of the policy.

The node agent (workers/sp/node_agent.py) starts it and drives it over a pipe with small
messages (dicts with an "op"); the worker never talks to the queue or the store's
request state. It keeps its weights across group changes: re-forming only re-runs
`join` (workers/sp/ulysses.py). Ops, each -> the fields of its reply:

- (start): imports, builds the model skeleton, connects to the agent's rendezvous store -> ready, startup_s
- `load_store`: loads weights from the tensor store (the naive path) -> hash, load_s
- `export`: copies its weights into a shared-memory segment for a joining peer -> shared (SharedWeights), export_s
- `import`: copies a peer's segment into its weights and checks the hash -> hash, copy_s
- `join`: leaves its group, forms group `prefix` as rank/world, warms up one forward ->
  leave_s, init_s, enable_s, warmup_s
- `run`: samples one request from a state up to stop_at at the group's degree -> rank 0: state
  (and text if it encoded it)
- `stop`: exits -> (no reply)

With no policy config the process is instead a member of the product path (workers/sp/node_member.py): it holds
no model until the first request names one, and answers that module's ops.

A failed collective (a member died) answers `{"op": "broken"}`; the agent re-forms the
group and resumes the request from its last committed state.
"""

from __future__ import annotations

import time
from multiprocessing.connection import Connection
from typing import Any

from resources.store import open_store


def worker_main(
    conn: Connection,
    worker_id: str,
    store_host: str,
    store_port: int,
    policy_config: dict[str, Any] | None,
    num_threads: int = 1,
    device: str = "cpu",
    store_url: str | None = None,
    model: str | None = None,
) -> None:
    """Process entry point (multiprocessing spawn target). policy_config None: a member of the product path
    (workers/sp/node_member.py) that serves queue requests of any run from `store_url` (only runs on the pipeline
    folder `model`, when given), on `device`."""
    t0 = time.perf_counter()
    import signal

    # A spot preemption's SIGTERM reaches the node's whole process group. The agent must outlive its members'
    # forwards to commit every in-flight request at a step boundary; it stops its workers itself afterwards.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    import torch

    torch.set_num_threads(num_threads)
    store = torch.distributed.TCPStore(store_host, store_port, is_master=False)
    if policy_config is None:
        from workers.sp.node_member import RequestMember  # lazy: pulls torch

        worker = RequestMember(worker_id, store_url, device, store, model)
        import diffusers  # noqa: F401,E401  (imports paid before "ready")

    else:
        worker = _Worker(worker_id, _pixel_policy(policy_config), store)
    conn.send({"op": "ready", "worker_id": worker_id, "startup_s": time.perf_counter() - t0})
    while True:
        try:
            msg = conn.recv()
        except EOFError:  # the agent is gone: nothing left to serve
            break
        if msg["op"] == "stop":
            break
        conn.send(worker.handle(msg))
    worker.close()


def _pixel_policy(policy_config: dict[str, Any]):
    from workers.model.tiny_policy import PolicyConfig, build_policy  # lazy: pulls torch

    cfg = PolicyConfig(**{**policy_config, "rope_axes": tuple(policy_config["rope_axes"])})
    policy = build_policy(cfg, seed=0).eval()
    import workers.algo.sampler  # noqa: F401,E401  (a standby pays imports before it is needed)

    return policy


class _Worker:
    def __init__(self, worker_id: str, policy, store):
        self.worker_id = worker_id
        self.policy = policy
        self.store = store
        self.rank, self.degree = 0, 1

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        handler = getattr(self, "_op_" + msg["op"], None)
        if handler is None:
            return {"op": "error", "error": f"unknown op {msg['op']!r}"}
        t0 = time.perf_counter()
        reply = handler(msg)
        reply.setdefault("op", msg["op"])
        reply.update(worker_id=self.worker_id, seconds=time.perf_counter() - t0)
        return reply

    def _op_load_store(self, msg):
        from workers.pulse.weights_hash import weights_hash  # lazy: pulls torch

        tensors = open_store(msg["store_url"]).load_tensors(msg["key"])
        self.policy.load_state_dict(tensors)
        return {"hash": weights_hash(self.policy.state_dict())}

    def _op_export(self, msg):
        from workers.sp.shared_weights import export_weights  # lazy: pulls torch

        return {"shared": export_weights(self.policy.state_dict(), msg["name"], msg.get("weights_hash"))}

    def _op_import(self, msg):
        from workers.sp.shared_weights import import_weights  # lazy: pulls torch

        return {"hash": import_weights(msg["shared"], self.policy.state_dict())}

    def _op_hash(self, msg):
        from workers.pulse.weights_hash import weights_hash  # lazy: pulls torch

        return {"hash": weights_hash(self.policy.state_dict())}

    def _op_join(self, msg):
        from workers.sp.ulysses import join_group  # lazy: pulls torch

        timing = join_group(
            self.policy, self.store, msg["prefix"], msg["rank"], msg["world_size"], timeout_s=msg.get("timeout_s", 30.0)
        )
        self.rank, self.degree = msg["rank"], msg["world_size"]
        t0 = time.perf_counter()
        try:
            self._warm_up()
        except RuntimeError as err:  # a member died while the group formed
            return {"op": "broken", "error": str(err)[:300]}
        return {
            "leave_s": timing.leave_s,
            "init_s": timing.init_s,
            "enable_s": timing.enable_s,
            "warmup_s": time.perf_counter() - t0,
        }

    def _warm_up(self) -> None:
        """One forward at the group's degree: the first call after a re-form allocates and plans."""
        import torch

        from workers.sp.ulysses import SequenceParallelPolicy  # lazy: pulls torch

        sp = SequenceParallelPolicy(self.policy, self.degree)
        size = self.policy.config.image_size
        emb, mask = sp.encode_prompts(["a red circle"])
        with torch.no_grad():
            sp.velocity(torch.zeros(1, 3, size, size), torch.ones(1), emb, mask)

    def _op_run(self, msg):
        try:
            return self._run(msg)
        except RuntimeError as err:  # gloo: "Connection reset by peer" when a member died
            return {"op": "broken", "error": str(err)[:300]}

    def _run(self, msg):
        import torch

        from workers.algo.sampler import SamplerConfig, SamplerState, rollout  # lazy: pulls torch
        from workers.sp.ulysses import SequenceParallelPolicy  # lazy: pulls torch

        config = SamplerConfig(**msg["sampler"])
        text = None if msg.get("text") is None else tuple(torch.from_numpy(a) for a in msg["text"])
        sp = SequenceParallelPolicy(self.policy, self.degree, text=text)
        resume = None
        if msg.get("state") is not None:
            s = msg["state"]
            resume = SamplerState(s["step"], torch.from_numpy(s["latents"]), torch.from_numpy(s["log_probs"]))
        init = None if msg.get("init_seed") is None else [msg["init_seed"]]
        traj = rollout(
            sp, [msg["prompt"]], [msg["seed"]], config, resume=resume, stop_at=msg["stop_at"], init_seeds=init
        )
        if self.rank != 0:
            return {"state": None}
        state = traj.state()
        reply = {"state": {"step": state.step, "latents": state.latents.numpy(), "log_probs": state.log_probs.numpy()}}
        if text is None:
            with torch.no_grad():  # as in rollout: nn.TransformerEncoderLayer's no-grad fast path rounds differently
                emb, mask = self.policy.encode_prompts([msg["prompt"]])
            reply["text"] = (emb.detach().numpy(), mask.numpy())
        return reply

    def close(self) -> None:
        from workers.sp.ulysses import leave_group  # lazy: pulls torch

        try:
            leave_group(self.policy)
        except RuntimeError:
            pass  # the group is already broken; the process is exiting anyway
