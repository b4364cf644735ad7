"""`python -m workers.sp`: serve rollout requests from the queue with the node's SP groups.

Each round claims at most one request per worker, picks the SP degree for that backlog
(workers/sp/degree.py; measured latencies once known, an Amdahl guess before), re-forms
the groups when the degree changes, samples, commits each result exclusively under its
request id and acks. Lost workers are handled inside NodeAgent.run_requests.
"""

from __future__ import annotations

import argparse
import logging
import time

log = logging.getLogger("spotlight.node_agent")
LEASE_S = 600.0
"""Lease per request; a round of one request per worker finishes well inside it on the tiny policy."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.sp", description=__doc__.split("\n")[0])
    parser.add_argument("--queue", required=True, help="Request queue URL (file path, sqlite:///..., redis://...).")
    parser.add_argument("--store", required=True, help="Tensor store URL holding the weights and results.")
    parser.add_argument("--weights-key", required=True, help="Commit key of the weights tensor dict.")
    parser.add_argument("--run", default="demo", help="Run name of the results' store keys.")
    parser.add_argument("--workers", type=int, default=2, help="Device workers on this node.")
    parser.add_argument("--commit-every", type=int, default=2)
    parser.add_argument("--max-requests", type=int, default=None, help="Stop after this many (default: until idle).")
    parser.add_argument("--idle-exit-s", type=float, default=10.0, help="Exit after the queue is empty this long.")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be >= 1")
    return serve(args)


def serve(args: argparse.Namespace) -> int:
    import dataclasses

    from resources.keys import rollout_key
    from resources.queues import open_queue
    from resources.stores import open_store
    from workers.sp.node_agent import AgentConfig, NodeAgent
    from workers.sp.node_groups import SPRequest
    from workers.model.policy import PolicyConfig

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    store = open_store(args.store)
    manifest = store.read_manifest(args.weights_key)
    if manifest is None or "policy_config" not in manifest.metadata:
        raise SystemExit(f"{args.weights_key}: no committed weights with a policy_config in their metadata")
    raw = dict(manifest.metadata["policy_config"])
    config = AgentConfig(policy_config=PolicyConfig(**{**raw, "rope_axes": tuple(raw["rope_axes"])}),
                         store_url=args.store, weights_key=args.weights_key, commit_every=args.commit_every)
    done, idle_since = 0, time.monotonic()
    with open_queue(args.queue) as queue, NodeAgent(config) as agent:
        ids = agent.spawn(args.workers)
        agent.load_from_store(ids[:1])
        for wid in ids[1:]:
            agent.copy_from_peer(wid)
        degree = 0
        while args.max_requests is None or done < args.max_requests:
            leases = _claim(queue, f"node{agent.store.port}", len(agent.live_loaded()))
            if not leases:
                if time.monotonic() - idle_since > args.idle_exit_s:
                    break
                time.sleep(0.5)
                continue
            degree = _reform_if_needed(agent, len(leases), degree)
            requests = [SPRequest.from_payload(l.request.request_id, l.request.payload) for l in leases]
            states = agent.run_requests(requests)
            for lease, req in zip(leases, requests):
                key = rollout_key(args.run, lease.request.iteration, req.request_id)
                state = states[req.request_id]
                store.publish_tensors(key, {"images": state.latents, "log_probs": state.log_probs},
                                      {"prompt": req.prompt, "seed": req.seed,
                                       "sampler": dataclasses.asdict(req.sampler)}, exclusive=True)
                queue.ack(lease, key)
                done += 1
            idle_since = time.monotonic()
            log.info("round: %d requests at degree %d (%d done)", len(leases), degree, done)
    return 0


def _claim(queue, worker_id: str, capacity: int) -> list:
    leases = []
    while len(leases) < capacity:
        lease = queue.claim(worker_id, LEASE_S)
        if lease is None:
            break
        leases.append(lease)
    return leases


def _reform_if_needed(agent, backlog: int, current: int) -> int:
    from workers.sp.ulysses import allowed_degrees
    from workers.sp.degree import amdahl_latency_s, choose_sp_degree

    agent.forget_dead()
    workers = len(agent.live_loaded())
    single = agent.latency_s.get(1, 1.0)
    latency = {d: agent.latency_s.get(d, amdahl_latency_s(single, d)) for d in
               allowed_degrees(agent.config.policy_config, workers)}
    choice = choose_sp_degree(workers, backlog, latency, current_degree=current or None, reform_s=0.5)
    if choice.degree != current:
        report = agent.form(choice.degree)
        log.info("re-formed at degree %d in %.3f s: %s", report.degree, report.total_s, report.groups)
    return choice.degree
