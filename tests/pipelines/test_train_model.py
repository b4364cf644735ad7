"""`spotlight train --model DIR`: a diffusers pipeline saved in a local folder, post-trained with LoRA or in full."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

from workers.model.families.tiny import build_tiny_pipeline

SPOTLIGHT = [sys.executable, "-m", "pipelines.cli"]


def _env(tmp_path) -> dict:
    """A bare environment; a PYTHONPATH given to the tests (a worktree under test) is kept."""
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if os.environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def _train(tmp_path, model, out, *args):
    if "--prompts" in args and not (tmp_path / "prompts.jsonl").exists():
        _prompts_file(tmp_path)
    return subprocess.run(
        [
            *SPOTLIGHT,
            "train",
            "--model",
            str(model),
            "--preset",
            "cpu_smoke",
            "--resolution",
            "32",
            "--reward",
            "jpeg_compressibility",
            "--out",
            str(out),
            "--json",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=_env(tmp_path),
    )


def _transformer_weights(folder) -> dict:
    weights = {}
    for path in sorted(folder.glob("*.safetensors")):
        weights.update(load_file(str(path)))
    return weights


FREE_TEXT = [
    {"prompt": "a lighthouse on a cliff at dusk, oil painting", "reference": "LIGHT"},
    {"prompt": "a bowl of ramen seen from above", "style": "photo"},
    {"prompt": "an astronaut riding a horse"},
    {"prompt": "a neon sign that says OPEN", "reference": "OPEN"},
]


def _prompts_file(tmp_path, rows=FREE_TEXT):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _velocity_of(policy, transformer):
    """`transformer`'s velocity at a fixed point, called the way the family's pipeline calls it."""
    cond, _ = policy.encode_prompts([FREE_TEXT[0]["prompt"]])
    x = torch.randn((1, *policy.latent_shape), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return policy.family.forward(
            transformer, x, policy.sigmas(4)[1].expand(1), cond.cond, policy.geometry, policy.model_spec
        )


@pytest.mark.slow
@pytest.mark.parametrize(
    "lora_rank, family",
    # Every family's LoRA through diffusers' own loader; full fine-tuning on one family in CI, the others nightly.
    [(4, "qwen-image"), (4, "sd3"), (4, "flux"), (0, "sd3")]
    + [pytest.param(0, family, marks=pytest.mark.nightly) for family in ("qwen-image", "flux")],
)
def test_train_posttrains_a_local_pipeline_on_the_users_prompts_and_diffusers_loads_the_result(
    tmp_path, family, lora_rank
):
    """From a folder outside the checkout: `spotlight train --model DIR --prompts prompts.jsonl`, then the output
    loaded the standard way (the pipeline's load_lora_weights, or from_pretrained) gives the trained velocity."""
    import diffusers
    import duckdb

    from resources.store import open_store
    from workers.trainer.checkpoint import load_checkpoint

    model = build_tiny_pipeline(family, tmp_path / family)
    done = _train(tmp_path, model, tmp_path / "run", "--lora-rank", str(lora_rank), "--prompts", "prompts.jsonl")
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    assert all(r["grad_norm"] > 0 for r in records[:2]), "the reward's contrast reached no trainable weight"
    with duckdb.connect(str(tmp_path / "run" / "ledger.duckdb"), read_only=True) as db:
        trained_on = {
            r[0] for r in db.execute("SELECT DISTINCT prompt FROM requests WHERE kind = 'rollout'").fetchall()
        }
    assert trained_on == {r["prompt"] for r in FREE_TEXT}  # 2 iterations x 2 prompts: one pass over the file
    spec = json.loads((tmp_path / "run" / "policy" / "spec.json").read_text())
    assert spec["family"] == family and spec["lora_rank"] == lora_rank and spec["path"] == str(model.resolve())

    trained, _ = load_checkpoint(open_store(str(tmp_path / "run" / "store")), "run", 2)
    expected = _velocity_of(trained, trained.transformer)
    if lora_rank:
        pipe = getattr(diffusers, trained.family.pipeline_class).from_pretrained(model, local_files_only=True)
        base = _velocity_of(trained, pipe.transformer)
        pipe.load_lora_weights(tmp_path / "run" / "policy" / "lora")
        loaded = pipe.transformer
    else:
        base = _velocity_of(
            trained,
            getattr(diffusers, trained.family.transformer_class).from_pretrained(
                model / "transformer", local_files_only=True
            ),
        )
        loaded = getattr(diffusers, trained.family.transformer_class).from_pretrained(
            tmp_path / "run" / "policy" / "transformer", local_files_only=True
        )
    velocity = _velocity_of(trained, loaded)
    torch.testing.assert_close(velocity, expected, rtol=1e-5, atol=1e-5)
    assert not torch.equal(velocity, base), "the saved output loads as the base model"


@pytest.mark.slow
def test_train_refuses_a_bad_prompts_file_before_any_weights_load(tmp_path):
    model = build_tiny_pipeline("sd3", tmp_path / "sd3")
    for rows, message in (
        ([{"prompt": "ok"}, {"text": "no prompt"}], "line 2 has no 'prompt' field"),
        ([{"prompt": "ok"}, {"prompt": " ".join(["red"] * 300)}], "line 2: the prompt has 301 tokens"),
    ):
        _prompts_file(tmp_path, rows)
        done = _train(tmp_path, model, tmp_path / "run", "--lora-rank", "4", "--prompts", "prompts.jsonl")
        assert done.returncode != 0 and message in " ".join(done.stderr.split()), done.stderr[-2000:]
        assert not (tmp_path / "run").exists(), "a refused run must write nothing"
    (tmp_path / "prompts.jsonl").write_text("")
    done = _train(tmp_path, model, tmp_path / "run", "--prompts", "prompts.jsonl")
    assert done.returncode != 0 and "holds no prompt" in done.stderr
    done = subprocess.run(
        [*SPOTLIGHT, "train", "--model", str(model), "--preset", "sd35m_lora", "--out", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=_env(tmp_path),
    )
    assert done.returncode != 0 and "names no reward" in " ".join(done.stderr.split())
    assert not (tmp_path / "run").exists()


def test_train_refuses_a_folder_that_is_not_a_supported_pipeline_before_any_compute(tmp_path):
    folder = tmp_path / "sd15"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionPipeline"}))
    done = _train(tmp_path, folder, tmp_path / "run")
    assert done.returncode != 0
    assert "StableDiffusionPipeline" in done.stderr and "QwenImagePipeline" in done.stderr
    assert not (tmp_path / "run").exists(), "a refused run must write nothing"
    done = subprocess.run(
        [*SPOTLIGHT, "train", "--lora-rank", "4"], capture_output=True, text=True, cwd=tmp_path, env=_env(tmp_path)
    )
    assert done.returncode != 0 and "--model" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "family", ["sd3"] + [pytest.param(family, marks=pytest.mark.nightly) for family in ("qwen-image", "flux")]
)
def test_run_samples_a_local_pipeline_on_queue_workers_through_preemptions(tmp_path, family):
    """`spotlight run --model DIR`: spot worker processes rebuild the LoRA policy from the PULSE anchor's spec,
    sample latents, decode them with the VAE, and resume committed requests after preemptions."""
    import duckdb

    model = build_tiny_pipeline(family, tmp_path / family)
    run = tmp_path / "run"
    _prompts_file(tmp_path)  # free text: the workers' requests carry it, and each prompt's fields
    done = subprocess.run(
        [
            *SPOTLIGHT,
            "run",
            "--model",
            str(model),
            "--preset",
            "cpu_smoke",
            "--iterations",
            "1",
            "--resolution",
            "32",
            "--lora-rank",
            "4",
            "--reward",
            "jpeg_compressibility",
            "--prompts",
            "prompts.jsonl",
            "--local-workers",
            "2",
            "--preemptions-per-hour",
            "120",
            "--run-dir",
            str(run),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env=_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with duckdb.connect(str(run / "ledger.duckdb"), read_only=True) as db:
        done_once = db.execute(
            "SELECT count(*), count(DISTINCT request_id), count(result_hash) FROM requests WHERE kind = 'rollout'"
        ).fetchone()
        workers = db.execute("SELECT count(DISTINCT worker_id) FROM requests WHERE kind = 'rollout'").fetchone()[0]
        rewards = [r[0] for r in db.execute("SELECT reward FROM requests WHERE kind = 'rollout'").fetchall()]
        prompts = {r[0] for r in db.execute("SELECT prompt FROM requests WHERE kind = 'rollout'").fetchall()}
        preemptions = db.execute("SELECT count(*) FROM preemptions").fetchone()[0]
    assert done_once == (8, 8, 8), done_once  # cpu_smoke: 2 prompts x 4 samples, each done once, with a result
    # 120 per worker-hour: seed 0's trace kills a worker 0.3 s after the cluster is ready, then about every 30 s (at
    # 600 a loaded machine's workers were killed before they finished loading, and the run never ended).
    assert preemptions >= 1, "120 preemptions per worker-hour over the run gave none: the trace is not applied"
    assert workers >= 1 and len(set(rewards)) > 1, "every sample scored alike: the VAE decode or the seeds are wrong"
    assert len(prompts) == 2 and prompts <= {r["prompt"] for r in FREE_TEXT}
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["model"]["model"] == str(model.resolve()) and saved["model"]["lora_rank"] == 4


@pytest.mark.slow
def test_train_with_merged_sync_publishes_weights_a_worker_runs_without_an_adapter(tmp_path):
    """`--sync-mode merged`: the run's PULSE chain carries BF16(base + LoRA delta); a fresh rollout worker replays it
    into a plain transformer, bit for bit the trainer's merged weights, while the checkpoints keep the adapter."""
    import duckdb

    from resources.store import open_store
    from workers.model.families.lora import merged_weights
    from workers.rollout.weights import PolicyHolder
    from workers.trainer.checkpoint import load_checkpoint

    model = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    done = _train(tmp_path, model, tmp_path / "run", "--lora-rank", "4", "--sync-mode", "merged")
    assert done.returncode == 0, done.stderr[-3000:]
    store = open_store(str(tmp_path / "run" / "store"))
    trained, _ = load_checkpoint(store, "run", 2)
    assert trained.is_lora and trained.model_spec.sync_mode == "merged"
    merged, targets = merged_weights(trained.transformer)
    worker = PolicyHolder(store).policy_at("run", 2)
    assert not worker.is_lora
    received = {k: v.to(torch.bfloat16) for k, v in worker.weights().items()}
    assert set(received) == set(merged) and all(torch.equal(received[k], merged[k]) for k in merged)
    with duckdb.connect(str(tmp_path / "run" / "ledger.duckdb"), read_only=True) as db:
        rows = db.execute("SELECT version, kind, dense_bytes, patch_bytes FROM syncs ORDER BY version").fetchall()
    assert [r[:2] for r in rows] == [(0, "anchor"), (1, "patch"), (2, "patch")]
    assert all(r[2] == sum(t.numel() * 2 for t in merged.values()) for r in rows)  # the merged transformer
    assert all(0 < r[3] < r[2] for r in rows[1:]), "a patch sends part of the merged weights"


def test_merged_sync_without_a_lora_is_refused_before_any_compute(tmp_path):
    model = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    done = _train(tmp_path, model, tmp_path / "run", "--lora-rank", "0", "--sync-mode", "merged")
    assert done.returncode != 0 and "lora_rank > 0" in done.stderr
    assert not (tmp_path / "run").exists(), "a refused run must write nothing"
