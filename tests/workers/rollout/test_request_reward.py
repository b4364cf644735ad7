"""A worker scores only with the rewards its run names in the store: a request from the queue cannot send the
worker's images (and its reward token) to a URL of its choosing."""

from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from resources.keys import run_rewards_key
from resources.queue import open_queue
from workers.rollout.request import check_run_reward
from workers.rollout.state import rollout_request
from workers.trainer.presets import get_preset


class _Recorder(BaseHTTPRequestHandler):
    hits: list[str] = []

    def do_POST(self) -> None:  # noqa: N802
        type(self).hits.append(self.headers.get("Authorization", ""))
        self.send_response(500)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def listener():
    """An HTTP server that records every POST it gets (a reward URL someone put in a request)."""
    _Recorder.hits = []
    server = HTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", _Recorder.hits
    server.shutdown()
    server.server_close()


def _requests(reward: str):
    from workers.coordinator.rollout import iteration_requests, queue_batches
    from workers.explore.seed_plan import default_seed_plan

    config = dataclasses.replace(get_preset("cpu_smoke"), reward=reward, group_size=2, seeds_per_request=2)
    planned = iteration_requests(config, "demo", 0, weights_version=0, plan=default_seed_plan(config, 0))
    return [rollout_request(rid, 0, spec) for rid, spec in queue_batches(planned, 2)]


def _serve(queue_url: str, store) -> list[dict]:
    from workers.rollout.config import WorkerConfig
    from workers.rollout.loop import WorkerLoop
    from workers.rollout.worker import build_parser

    events: list[dict] = []
    args = build_parser().parse_args(
        [
            "--queue",
            queue_url,
            "--store",
            str(store.url),
            "--worker-id",
            "w0",
            "--max-idle-s",
            "1",
            "--poll-s",
            "0.05",
            "--threads",
            "1",
        ]
    )
    args.instance_type = "local-cpu"
    with open_queue(queue_url) as queue:
        WorkerLoop(
            queue,
            store,
            WorkerConfig.from_args(args),
            threading.Event(),
            lambda event, **f: events.append({"event": event, **f}),
        ).run()
    return events


def test_a_request_naming_a_url_the_run_does_not_name_is_refused_and_nothing_is_posted(
    rollout_store, listener, tmp_path, monkeypatch
) -> None:
    url, hits = listener
    monkeypatch.setenv("SPOTLIGHT_REWARD_TOKEN", "worker-token-Zx1")
    rollout_store.put_bytes(run_rewards_key("demo"), json.dumps(["minigeneval", "minigeneval_strict"]).encode())
    queue_url = str(tmp_path / "queue.db")
    with open_queue(queue_url) as queue:
        queue.put(_requests(url))
    events = _serve(queue_url, rollout_store)
    failed = [e for e in events if e["event"] == "failed"]
    assert failed and all("which is not one of the run's" in e["error"] for e in failed)
    assert not [e for e in events if e["event"] == "acked"] and hits == []
    with open_queue(queue_url) as queue:
        assert queue.stats().done == 0


def test_the_runs_own_rewards_are_scored_and_a_url_needs_the_runs_list(rollout_store, tmp_store) -> None:
    rollout_store.put_bytes(run_rewards_key("demo"), json.dumps(["http://reward-node:8200", "minigeneval"]).encode())
    check_run_reward(rollout_store, "demo", "http://reward-node:8200")  # the run named it: allowed
    check_run_reward(rollout_store, "demo", "minigeneval")
    with pytest.raises(ValueError, match="not one of the run's"):
        check_run_reward(rollout_store, "demo", "jpeg_compressibility")
    # A store without the run's list: registry names only, never a URL.
    check_run_reward(tmp_store, "other", "minigeneval")
    for reward in ("http://evil:80", 'multi:{"rewards": {"a": "https://evil"}, "weights": {"a": 1}}'):
        with pytest.raises(ValueError, match="names a remote reward"):
            check_run_reward(tmp_store, "other", reward)


def test_the_coordinator_names_its_training_and_validation_rewards_in_the_store(tmp_path) -> None:
    from workers.coordinator.context import RunContext
    from workers.coordinator.phases import publish_run_rewards

    config = dataclasses.replace(get_preset("cpu_smoke"), reward="jpeg_compressibility")
    ctx = RunContext.local(tmp_path / "run", "demo", "cpu_smoke", config, report=False)
    publish_run_rewards(ctx)
    named = json.loads(ctx.store.get_bytes(run_rewards_key("demo")))
    assert "jpeg_compressibility" in named and len(named) == 2  # and the pixel policy's validation detector
    ctx.ledger.close()
