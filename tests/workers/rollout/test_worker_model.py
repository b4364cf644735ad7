"""A rollout worker started with `--model DIR` (SkyPilot's MODEL): a node without the weights there stops at start
with what to do, and a worker handed a run on another model gives the request back and stops instead of failing
every request of the run."""

from __future__ import annotations

import json
import signal

import pytest

from resources.queue import open_queue
from workers.algo.sampler import SamplerConfig
from workers.rollout.state import RolloutSpec, rollout_request
from workers.rollout.weights import ModelMismatchError, PolicyHolder, _check_model
from workers.rollout.worker import build_parser, check_args, main

SPEC = RolloutSpec("demo", "two red circles", 11, 0, SamplerConfig(num_steps=2, sde_window=(0, 1)))


@pytest.fixture
def keep_signal_handlers():
    """main() installs its SIGTERM/SIGINT handlers: give pytest its own back afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def _pipeline_folder(path):
    path.mkdir(parents=True)
    (path / "model_index.json").write_text(json.dumps({"_class_name": "QwenImagePipeline"}))
    return path


def _args(*extra: str):
    args = build_parser().parse_args(["--queue", "q.db", "--store", "store", *extra])
    args.worker_id = "w0"
    return args


def test_the_model_folder_is_checked_at_start(tmp_path):
    with pytest.raises(ValueError, match="no diffusers pipeline on this node.*mount the weights"):
        check_args(_args("--model", str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="must be an absolute path"):
        check_args(_args("--model", "models/qwen"))
    args = _args("--model", str(_pipeline_folder(tmp_path / "qwen")))
    check_args(args)
    assert args.model == str(tmp_path / "qwen")
    empty = _args("--model", "")  # MODEL="" in a SkyPilot task: the pixel policy, no check
    check_args(empty)
    assert empty.model is None


def test_a_worker_whose_node_lacks_the_weights_exits_2_before_opening_anything(tmp_path, capsys):
    code = main(
        [
            "--queue",
            str(tmp_path / "queue.db"),
            "--store",
            str(tmp_path / "store"),
            "--model",
            str(tmp_path / "models" / "qwen"),
        ]
    )
    assert code == 2 and "no diffusers pipeline on this node" in capsys.readouterr().err
    assert not (tmp_path / "queue.db").exists()


def test_an_anchor_of_another_model_is_refused_before_anything_loads():
    _check_model({"family": "qwen-image", "path": "/models/a"}, "demo", "/models/a")
    _check_model({"family": "qwen-image", "path": "/models/a"}, "demo", None)  # no --model: whatever the anchor names
    with pytest.raises(ModelMismatchError, match="trains the pipeline at /models/a .* --model /models/b"):
        _check_model({"family": "qwen-image", "path": "/models/a"}, "demo", "/models/b")


def test_a_worker_for_another_model_gives_the_request_back_and_stops(
    rollout_store, tmp_path, capsys, keep_signal_handlers
):
    queue_url = str(tmp_path / "queue.db")
    with open_queue(queue_url) as queue:
        queue.put([rollout_request("r0", 0, SPEC)])
    with pytest.raises(ModelMismatchError, match="trains the pixel policy"):
        PolicyHolder(rollout_store, model="/models/qwen").policy_at("demo", 0)
    code = main(
        [
            "--queue",
            queue_url,
            "--store",
            str(rollout_store.url),
            "--worker-id",
            "w0",
            "--max-idle-s",
            "5",
            "--model",
            str(_pipeline_folder(tmp_path / "models" / "qwen")),
        ]
    )
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 2 and events[-1]["reason"] == "misconfigured"
    assert [e["event"] for e in events].count("failed") == 1  # one request given back, not every delivery burnt
    with open_queue(queue_url) as queue:
        stats = queue.stats()
    assert stats.pending == 1 and stats.done == 0  # still there for a worker that serves this run
