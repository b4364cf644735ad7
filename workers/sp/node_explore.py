"""The node agent's exploration requests: each on one device worker alone, with the rollout worker's own code.

An exploration request (workers/explore/request.py) samples M candidate seeds of one prompt with a cheap sampler on
stale weights and scores them. It is short, keeps no in-flight state, and its cache hooks (FirstBlockCache,
TaylorSeer) are diffusers' single-process ones. So the agent hands each one to a single member, which takes its
group's Ulysses hooks off and calls `work_explore_request` with its own PolicyHolder (workers/sp/node_member.py): the
rewards are committed exclusively at the request's key exactly as a rollout worker commits them. Up to one request
per live member runs at once; the agent prints each member's events (with the member as `group`) and acks.

Example:
    serve_explore(agent, queue, report, leases, node_id="n0", stop=stop, give_back=server.give_back)
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Callable

from resources.queue.records import Lease
from workers.sp.group_policy import GroupChannel, reply_error


def serve_explore(
    agent,
    queue,
    report,
    leases: list[Lease],
    *,
    node_id: str,
    stop: threading.Event,
    give_back: Callable[[Lease, Exception], None],
) -> None:
    """Work every exploration lease on the live members, one request per member at a time. Each is acked, or given
    back: with `give_back` for a bad request, released after a `group_lost` event when its member died, released
    unworked once the node is stopping. The caller keeps the leases alive (LeaseKeeper)."""
    pending = deque(leases)
    while pending:
        if stop.is_set():
            for lease in pending:
                queue.release(lease)
            return
        agent.forget_dead()
        members = agent.live_loaded()
        if not members:
            raise RuntimeError("every device worker of the node is lost")
        batch = [pending.popleft() for _ in range(min(len(members), len(pending)))]
        _explore_batch(agent, queue, report, batch, members[: len(batch)], node_id, give_back)


def _explore_batch(
    agent,
    queue,
    report,
    leases: list[Lease],
    members: list[str],
    node_id: str,
    give_back: Callable[[Lease, Exception], None],
) -> None:
    """leases[i] on members[i], all at once; then each one's outcome."""
    channel = GroupChannel([agent.workers[w] for w in members], agent.config.reply_timeout_s)
    msgs = [
        {"op": "explore", "request": lease.request, "worker_id": f"{node_id}/{wid}", "attempt": lease.attempts}
        for lease, wid in zip(leases, members, strict=False)
    ]
    replies, _ = channel.call_each(msgs)
    for lease, wid in zip(leases, members, strict=False):
        reply = replies.get(wid)
        if reply is None:  # died (or went silent and was killed) mid-request: nothing was committed
            report("group_lost", request_id=lease.request_id, group=wid, dead=[wid], error=None)
            queue.release(lease)
            continue
        for event in reply.get("events", []):  # claim and done, as a rollout worker prints them
            fields = {k: v for k, v in event.items() if k != "event"}
            report(event["event"], group=wid, **fields)
        if reply["op"] == "explore":
            first = queue.ack(lease, reply["result_key"])
            report("acked", request_id=lease.request_id, first=first, attempt=lease.attempts, group=wid)
        elif reply["op"] == "error":
            give_back(lease, reply_error(reply))
        else:  # "broken": a RuntimeError in the member's own compute (out of memory, say); no group was involved
            give_back(lease, RuntimeError(f"device worker {wid}: {reply.get('error')}"))
