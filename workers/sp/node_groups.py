"""The node agent's request loop: run requests chunk by chunk on its SP groups, commit, notice losses.

Each request advances in chunks of `commit_every` denoising steps. A chunk is sent to
every member of a group; rank 0 answers with the new SamplerState, which the agent
commits (keeps as the request's resume point). A worker whose process dies (its sentinel
fires) or whose collective fails ("broken") ends the round: the loop drains the other
groups' chunks, puts the interrupted requests back with their committed state and
returns False so the agent re-forms the groups and calls it again.

Example:
    runner = GroupRunner(agent, on_dispatch=None)
    while not runner.run(requests):
        agent.form()
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable, Mapping

from workers.algo.sampler import SamplerConfig, SamplerState


@dataclass(frozen=True)
class SPRequest:
    """One rollout request as an SP group samples it: a batch of one (prompt, seed)."""

    request_id: str
    prompt: str
    seed: int
    sampler: SamplerConfig = SamplerConfig()
    init_seed: int | None = None
    """The seed of the initial noise when the prompt's group shares one (RolloutSpec.init_seed); None = seed."""

    @classmethod
    def from_payload(cls, request_id: str, payload: Mapping[str, Any]) -> "SPRequest":
        """From a queue request's payload: prompt, seed and optional sampler fields."""
        missing = {"prompt", "seed"} - set(payload)
        if missing:
            raise ValueError(f"request {request_id!r}: payload lacks {sorted(missing)}")
        sampler = dict(payload.get("sampler") or {})
        if "sde_window" in sampler and sampler["sde_window"] is not None:
            sampler["sde_window"] = tuple(sampler["sde_window"])
        init_seed = payload.get("init_seed")
        return cls(
            request_id,
            str(payload["prompt"]),
            int(payload["seed"]),
            SamplerConfig(**sampler),
            None if init_seed is None else int(init_seed),
        )


def state_from_wire(wire: Mapping[str, Any]) -> SamplerState:
    import torch

    return SamplerState(wire["step"], torch.from_numpy(wire["latents"]), torch.from_numpy(wire["log_probs"]))


@dataclass
class _Chunk:
    request: SPRequest
    group: int
    awaiting: set[str]
    started_s: float
    broken: bool = False


class GroupRunner:
    def __init__(self, agent, on_dispatch: Callable[[str, int], None] | None = None):
        self.agent = agent
        self.on_dispatch = on_dispatch
        self.first_dispatch: dict[str, tuple[float, int, int]] = {}
        """request id -> (time, generation, degree) of its first chunk, for latency figures."""

    def run(self, requests: list[SPRequest]) -> bool:
        """Advance every request until done (True) or until a worker is lost (False, drained)."""
        pending = [r for r in requests if not self._done(r)]
        free = list(range(len(self.agent.groups)))
        busy: dict[int, _Chunk] = {}
        lost = False
        while pending or busy:
            while free and pending and not lost:
                group = free.pop(0)
                chunk = self._dispatch(group, pending.pop(0))
                busy[group] = chunk
                lost = lost or chunk.broken
            if not busy:
                break
            for group in self._wait(busy):
                chunk = busy.pop(group)
                lost = lost or chunk.broken
                if chunk.broken or not self._done(chunk.request):
                    pending.insert(0, chunk.request)
                else:
                    self._record_latency(chunk.request)
                free.append(group)
        return not lost and not pending

    def _done(self, request: SPRequest) -> bool:
        wire = self.agent.committed.get(request.request_id)
        return wire is not None and wire["step"] == request.sampler.num_steps

    def _dispatch(self, group: int, request: SPRequest) -> _Chunk:
        agent = self.agent
        members = agent.groups[group]
        wire = agent.committed.get(request.request_id)
        step = 0 if wire is None else wire["step"]
        msg = {
            "op": "run",
            "prompt": request.prompt,
            "seed": request.seed,
            "init_seed": request.init_seed,
            "sampler": dataclasses.asdict(request.sampler),
            "state": wire,
            "stop_at": min(step + agent.config.commit_every, request.sampler.num_steps),
            "text": agent.text_cache.get(request.prompt),
        }
        self.first_dispatch.setdefault(request.request_id, (time.perf_counter(), agent.generation, len(members)))
        chunk = _Chunk(request, group, set(members), time.perf_counter())
        for wid in members:
            try:
                agent.workers[wid].send(msg)
            except (BrokenPipeError, OSError):  # died between chunks
                chunk.awaiting.discard(wid)
                chunk.broken = True
        if self.on_dispatch is not None:
            self.on_dispatch(request.request_id, step)
        return chunk

    def _wait(self, busy: dict[int, _Chunk]) -> list[int]:
        """Block until some member answers or dies; return the groups whose chunk is over."""
        workers = self.agent.workers
        owner = {wid: g for g, c in busy.items() for wid in c.awaiting}
        ready = wait([workers[w].conn for w in owner] + [workers[w].proc.sentinel for w in owner])
        for wid, group in owner.items():
            handle, chunk = workers[wid], busy[group]
            if handle.conn in ready or handle.conn.poll():
                try:
                    self._take_reply(chunk, wid, handle.conn.recv())
                    continue
                except (EOFError, OSError):  # the pipe of a killed worker
                    pass
            if handle.proc.sentinel in ready or not handle.proc.is_alive():
                chunk.awaiting.discard(wid)
                chunk.broken = True
        return [g for g, c in busy.items() if not c.awaiting]

    def _take_reply(self, chunk: _Chunk, wid: str, reply: dict) -> None:
        chunk.awaiting.discard(wid)
        if reply["op"] == "broken":
            chunk.broken = True
            return
        if reply["op"] != "run":
            raise RuntimeError(f"worker {wid} answered {reply} to a chunk")
        if reply.get("state") is not None:
            self.agent.committed[chunk.request.request_id] = reply["state"]
        if reply.get("text") is not None:
            self.agent.text_cache[chunk.request.prompt] = reply["text"]

    def _record_latency(self, request: SPRequest) -> None:
        started, generation, degree = self.first_dispatch[request.request_id]
        if generation == self.agent.generation:  # ran start to end in one group
            seconds = time.perf_counter() - started
            old = self.agent.latency_s.get(degree)
            self.agent.latency_s[degree] = seconds if old is None else 0.8 * old + 0.2 * seconds
