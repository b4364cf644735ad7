"""An SP group as the rollout worker's request code sees it: a policy holder, and a policy whose forwards run on
the group's device workers.

`work_request` (workers/rollout/request.py) resumes, steps, commits and publishes a request exactly as in a
rollout worker; of its holder it asks only `policy_for(spec)`, and of that policy `latent_shape`, `parameters()`
(for the device), `sigmas`, `encode_prompts`, `velocity` and `decode`. GroupHolder and GroupPolicy answer those
with messages to every member of one group (workers/sp/node_member.py). So the SDE maths, the counter-based noise
and every store write stay in the agent, on the CPU, exactly the rollout worker's code; the members compute only
the transformer's forwards (and rank 0 the VAE decode).

A member that dies (its process sentinel fires), a collective that fails (a member answers `broken`) or a member
silent past `timeout_s` (it is killed) raises GroupLost out of the request code, with nothing committed past the
last commit; the agent re-forms its groups and runs the request again, which resumes from that commit.

Example:
    channel = GroupChannel([agent.workers[w] for w in members])
    outcome = work_request(lease.request, lease.attempts, store, GroupHolder(channel), worker_id="node/w0+w1",
                           commit_every=2)
"""

from __future__ import annotations

from multiprocessing.connection import wait
from typing import Any

import torch

from resources.store.base import StoreError
from workers.rollout.weights import ModelMismatchError


class GroupLost(RuntimeError):
    """A group can no longer compute: a member died, went silent, or its collective failed."""

    def __init__(self, members: list[str], dead: list[str], error: str | None = None):
        self.members, self.dead, self.error = members, dead, error
        why = f"members {dead} died" if dead else f"a collective failed: {error}"
        super().__init__(f"SP group {'+'.join(members)} lost: {why}")


_REQUEST_ERRORS = {
    "ModelMismatchError": ModelMismatchError,
    "ValueError": ValueError,
    "LookupError": LookupError,
    "StoreError": StoreError,
}


def reply_error(reply: dict[str, Any]) -> Exception:
    """The exception a member's `error` reply stands for (its type by name; RuntimeError for an unknown one)."""
    return _REQUEST_ERRORS.get(reply.get("error_type", ""), RuntimeError)(reply["error"])


class GroupChannel:
    """The agent's pipes to one group's members, in rank order: one op to all (or some), every reply gathered."""

    def __init__(self, handles: list, timeout_s: float = 600.0):
        self.handles = list(handles)
        self.timeout_s = timeout_s

    @property
    def members(self) -> list[str]:
        return [h.worker_id for h in self.handles]

    def call(self, msg: dict[str, Any], ranks: list[int] | None = None) -> dict[str, Any]:
        """Send `msg` to the members at `ranks` (default: all) and return the first one's reply. Raises
        GroupLost (member lost), or the member's ModelMismatchError / ValueError / LookupError / StoreError (a bad
        request)."""
        targets = self.handles if ranks is None else [self.handles[r] for r in ranks]
        replies, dead = self.call_each([msg] * len(targets), targets)
        broken = [r for r in replies.values() if r["op"] == "broken"]
        if dead or broken:
            raise GroupLost(self.members, dead, broken[0].get("error") if broken else None)
        errors = [r for r in replies.values() if r["op"] == "error"]
        if errors:
            raise reply_error(errors[0])
        first = replies[targets[0].worker_id]
        if first["op"] != msg["op"]:
            raise RuntimeError(f"worker {targets[0].worker_id} answered {first['op']!r} to {msg['op']!r}")
        return first

    def call_each(self, msgs: list[dict[str, Any]], handles: list | None = None) -> tuple[dict[str, dict], list[str]]:
        """msgs[i] to the i-th of `handles` (default: the members in rank order); returns every reply by worker id
        and the ids of those that died or stayed silent. Raises nothing: each reply is its sender's own outcome."""
        handles = self.handles[: len(msgs)] if handles is None else handles
        dead = []
        for handle, msg in zip(handles, msgs, strict=True):
            try:
                handle.send(msg)
            except (BrokenPipeError, OSError):  # died since its last reply
                dead.append(handle.worker_id)
        replies, silent_or_dead = self._gather([h for h in handles if h.worker_id not in dead])
        return replies, dead + silent_or_dead

    def _gather(self, handles: list) -> tuple[dict[str, dict], list[str]]:
        """Every live member's reply; those that died (or stayed silent past timeout_s, then killed) by id."""
        waiting = {h.worker_id: h for h in handles}
        closed: set[str] = set()
        replies, dead = {}, []
        while waiting:
            objects = [h.proc.sentinel for h in waiting.values()]
            objects += [h.conn for w, h in waiting.items() if w not in closed]
            if not wait(objects, timeout=self.timeout_s):
                for wid, handle in waiting.items():  # silent too long: a hung member is a lost member
                    handle.proc.kill()
                    dead.append(wid)
                break
            for wid, handle in list(waiting.items()):
                if wid not in closed and handle.conn.poll():
                    try:
                        replies[wid] = handle.conn.recv()
                        del waiting[wid]
                        continue
                    except (EOFError, OSError):  # the pipe of a dead process: wait for its sentinel
                        closed.add(wid)
                if not handle.proc.is_alive():
                    dead.append(wid)
                    del waiting[wid]
        return replies, dead


class GroupHolder:
    """PolicyHolder's `policy_for`, answered by a group: every member brings its own holder to the request."""

    def __init__(self, channel: GroupChannel):
        self.channel = channel

    def policy_for(self, spec) -> "GroupPolicy":
        reply = self.channel.call({"op": "prepare", "payload": spec.to_payload()})
        labels = {"device_type": reply["device_type"], "kernel_set": reply["kernel_set"]}
        return GroupPolicy(self.channel, tuple(reply["shape"]), labels)


class _Prompts(tuple):
    """What encode_prompts returns: the members hold the conditioning; the agent only names the prompts."""


class GroupPolicy:
    """The policy the request code samples with; the group computes, the agent walks the SDE on the CPU."""

    def __init__(self, channel: GroupChannel, latent_shape: tuple[int, ...], kernel_labels: dict[str, str]):
        self.channel = channel
        self.latent_shape = latent_shape
        self.kernel_labels = kernel_labels
        """The members' device type and kernel set: the request code stamps them on each attempt, not the agent's."""
        self._device_marker = torch.zeros(())

    def parameters(self):
        """The sampler's device for latents, noise and the SDE step: the agent's CPU."""
        return iter([self._device_marker])

    def sigmas(self, num_steps: int, shift: float = 1.0) -> torch.Tensor:
        reply = self.channel.call({"op": "sigmas", "num_steps": num_steps, "shift": shift}, ranks=[0])
        return torch.from_numpy(reply["sigmas"])

    def encode_prompts(self, prompts: list[str]) -> tuple[_Prompts, None]:
        self.channel.call({"op": "encode", "prompts": list(prompts)})
        return _Prompts(prompts), None

    def velocity(self, x: torch.Tensor, sigma_N: torch.Tensor, cond: _Prompts, mask=None) -> torch.Tensor:
        reply = self.channel.call(
            {"op": "velocity", "x": x.detach().cpu().numpy(), "sigma": sigma_N.detach().cpu().numpy()}
        )
        return torch.from_numpy(reply["v"])

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        reply = self.channel.call({"op": "decode", "latents": latents.detach().cpu().numpy()}, ranks=[0])
        return torch.from_numpy(reply["images"])
