"""`spotlight train --model DIR`: a diffusers pipeline saved in a local folder, post-trained with LoRA or in full."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from workers.model.families.tiny import build_tiny_pipeline

SPOTLIGHT = [sys.executable, "-m", "pipelines.cli"]


def _train(tmp_path, model, out, *args):
    return subprocess.run([*SPOTLIGHT, "train", "--model", str(model), "--preset", "cpu_smoke", "--resolution", "32",
                           "--reward", "jpeg_compressibility", "--out", str(out), "--json", *args],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})


@pytest.mark.slow
@pytest.mark.parametrize("lora_rank", [4, 0])
def test_train_posttrains_a_local_qwen_image_pipeline_and_saves_what_trained(tmp_path, lora_rank):
    model = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    done = _train(tmp_path, model, tmp_path / "run", "--lora-rank", str(lora_rank))
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert all(r["grad_norm"] > 0 for r in records[:2]), "the reward's contrast reached no trainable weight"
    spec = json.loads((tmp_path / "run" / "policy" / "spec.json").read_text())
    assert spec["family"] == "qwen-image" and spec["lora_rank"] == lora_rank and spec["path"] == str(model.resolve())
    if lora_rank:
        adapter = load_file(str(tmp_path / "run" / "policy" / "lora" / "pytorch_lora_weights.safetensors"))
        assert adapter and all("lora" in k for k in adapter)
        assert any(float(v.abs().sum()) > 0 for k, v in adapter.items() if "lora_B" in k), "LoRA B never moved"
    else:
        from diffusers import QwenImageTransformer2DModel

        base = QwenImageTransformer2DModel.from_pretrained(model / "transformer").state_dict()
        trained = QwenImageTransformer2DModel.from_pretrained(tmp_path / "run" / "policy" / "transformer").state_dict()
        assert any(not (trained[k] == base[k]).all() for k in base), "full fine-tuning moved no weight"


def test_train_refuses_a_folder_that_is_not_a_supported_pipeline_before_any_compute(tmp_path):
    folder = tmp_path / "sd15"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    done = _train(tmp_path, folder, tmp_path / "run")
    assert done.returncode != 0
    assert "StableDiffusionPipeline" in done.stderr and "QwenImagePipeline" in done.stderr
    assert not (tmp_path / "run").exists(), "a refused run must write nothing"
    done = subprocess.run([*SPOTLIGHT, "train", "--lora-rank", "4"], capture_output=True, text=True, cwd=tmp_path,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode != 0 and "--model" in done.stderr


@pytest.mark.slow
def test_run_samples_a_local_pipeline_on_queue_workers_through_preemptions(tmp_path):
    """`spotlight run --model DIR`: spot worker processes rebuild the LoRA policy from the PULSE anchor's spec,
    sample latents, decode them with the VAE, and resume committed requests after preemptions."""
    import duckdb

    model = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    run = tmp_path / "run"
    done = subprocess.run([*SPOTLIGHT, "run", "--model", str(model), "--preset", "cpu_smoke", "--iterations", "1",
                           "--resolution", "32", "--lora-rank", "4", "--reward", "jpeg_compressibility",
                           "--workers", "2", "--preemptions-per-hour", "600", "--run-dir", str(run)],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    with duckdb.connect(str(run / "ledger.duckdb"), read_only=True) as db:
        done_once = db.execute("SELECT count(*), count(DISTINCT request_id), count(result_hash) FROM requests "
                           "WHERE kind = 'rollout'").fetchone()
        workers = db.execute("SELECT count(DISTINCT worker_id) FROM requests WHERE kind = 'rollout'").fetchone()[0]
        rewards = [r[0] for r in db.execute("SELECT reward FROM requests WHERE kind = 'rollout'").fetchall()]
        preemptions = db.execute("SELECT count(*) FROM preemptions").fetchone()[0]
    assert done_once == (8, 8, 8), done_once  # cpu_smoke: 2 prompts x 4 samples, each done once, with a result
    assert preemptions >= 1, "600 preemptions per worker-hour over the run gave none: the trace is not applied"
    assert workers >= 1 and len(set(rewards)) > 1, "every sample scored alike: the VAE decode or the seeds are wrong"
    report = json.loads((run / "run.json").read_text())
    assert report["model"] == str(model.resolve()) and report["lora_rank"] == 4
