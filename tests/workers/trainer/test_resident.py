"""The resident policy: a process builds its policy once (one `from_pretrained` of the base transformer) and every
phase of every iteration updates that object in place."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from workers.model.families.tiny import build_tiny_pipeline
from workers.trainer import resident


@pytest.fixture
def loads(monkeypatch):
    """Every diffusers model `from_pretrained` in this process from now on: (class name, subfolder)."""
    from diffusers.models.modeling_utils import ModelMixin

    calls: list[tuple[str, str | None]] = []
    original = ModelMixin.from_pretrained.__func__

    def counted(cls, *args, **kwargs):
        calls.append((cls.__name__, kwargs.get("subfolder")))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(ModelMixin, "from_pretrained", classmethod(counted))
    resident.release_resident()
    yield calls
    resident.release_resident()


@pytest.mark.slow
def test_spotlight_train_loads_the_base_transformer_once_over_three_iterations(tmp_path, loads):
    from pipelines.cli import app

    model = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    loads.clear()
    done = CliRunner().invoke(
        app,
        [
            "train",
            "--model",
            str(model),
            "--preset",
            "cpu_smoke",
            "--iterations",
            "3",
            "--resolution",
            "32",
            "--lora-rank",
            "4",
            "--reward",
            "jpeg_compressibility",
            "--out",
            str(tmp_path / "run"),
            "--json",
        ],
        catch_exceptions=False,
    )
    assert done.exit_code == 0, done.output[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["iteration"] for r in records] == [0, 1, 2, 3]
    assert all(r["grad_norm"] > 0 for r in records[:3]), "an update reached no trainable weight"
    transformers = [c for c in loads if c[1] == "transformer"]
    # sync, rollout, train and validate of 3 iterations plus the final one and the saved policy: one build
    assert transformers == [("QwenImageTransformer2DModel", "transformer")], loads
    assert [c for c in loads if c[1] == "vae"] == [("AutoencoderKLQwenImage", "vae")]
    frozen = resident.resident_policy().frozen
    # Every prompt of the run was encoded at the base version, then the text encoders went.
    assert frozen.loaded.count("text_encoders") == 1 and frozen.text_encoders_dropped and frozen._text_pipe is None


def test_a_resident_checkpoint_takes_each_versions_weights_in_place(tmp_path, loads):
    """Version 1 after version 0 is the same object with version 1's weights, bit for bit what a fresh build
    loads; asking again for the version in place copies nothing."""
    import torch

    from resources.store import open_store
    from workers.model.families.diffusers_policy import load_model_policy
    from workers.trainer.checkpoint import load_checkpoint, save_checkpoint

    model = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    store = open_store(str(tmp_path / "store"))
    policy = load_model_policy(model, resolution=32, lora_rank=4)
    save_checkpoint(store, "r", 0, policy)
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.5)
    save_checkpoint(store, "r", 1, policy)
    loads.clear()
    first, _ = resident.resident_checkpoint(store, "r", 0)
    second, _ = resident.resident_checkpoint(store, "r", 1)
    assert second is first and len([c for c in loads if c[1] == "transformer"]) == 1
    fresh, _ = load_checkpoint(store, "r", 1)
    assert all(torch.equal(v, fresh.weights()[k]) for k, v in second.weights().items())
    again, _ = resident.resident_checkpoint(store, "r", 0)
    assert all(torch.equal(v, load_checkpoint(store, "r", 0)[0].weights()[k]) for k, v in again.weights().items())


@pytest.mark.nightly
@pytest.mark.slow
def test_spotlight_run_walks_three_iterations_of_dagster_assets_on_one_build(tmp_path, loads):
    """The Dagster walk runs every asset's step in the command's process: its phases share the resident policy
    as `spotlight train`'s do (queue workers hold one policy per process of their own: workers/rollout/weights.py)."""
    from pipelines.cli import app

    model = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    loads.clear()
    done = CliRunner().invoke(
        app,
        [
            "run",
            "--model",
            str(model),
            "--preset",
            "cpu_smoke",
            "--iterations",
            "3",
            "--resolution",
            "32",
            "--lora-rank",
            "4",
            "--reward",
            "jpeg_compressibility",
            "--rollouts",
            "inprocess",
            "--run-dir",
            str(tmp_path / "run"),
        ],
        catch_exceptions=False,
    )
    assert done.exit_code == 0, done.output[-3000:]
    assert [c for c in loads if c[1] == "transformer"] == [("QwenImageTransformer2DModel", "transformer")], loads


def test_the_version_in_place_with_a_sharded_optimizer_reads_no_weights_from_the_store(tmp_path, monkeypatch):
    """Rank 0 of full fine-tuning asks for its resident policy at version k to broadcast it (train.py `_restore`),
    and every later phase asks for k + 1: the weights are in place and AdamW's shards live apart, so nothing of the
    checkpoint (a whole FP32 copy of the model) is read again."""
    from resources.store import open_store
    from workers.model.tiny_policy import SHIPPED_BASE, load_policy
    from workers.trainer.checkpoint import publish_checkpoint
    from workers.trainer.optimizer_state import SHARDED_FORMAT

    store = open_store(str(tmp_path / "store"))
    policy = load_policy(SHIPPED_BASE)
    publish_checkpoint(store, "r", 1, policy.spec(), policy.weights(), {"format": SHARDED_FORMAT, "key": "elsewhere"})
    resident.release_resident()
    try:
        first, state = resident.resident_checkpoint(store, "r", 1)
        assert state is not None and state.sharded
        reads = []
        load_tensors = type(store).load_tensors
        monkeypatch.setattr(type(store), "load_tensors", lambda self, key: reads.append(key) or load_tensors(self, key))
        again, state = resident.resident_checkpoint(store, "r", 1)
        assert again is first and state.sharded and reads == []
    finally:
        resident.release_resident()
