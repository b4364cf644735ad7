"""`spotlight run --sync-mode merged`: the pipeline's sync phase publishes BF16(base + LoRA delta), queue workers
sample it with no adapter, and a fresh worker replays the chain to the trainer's merged weights; here with the
reserved node's shape too: two trainer ranks, and a local worker that rank 0 alone starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import yaml

from workers.model.families.tiny import build_tiny_pipeline

SPOTLIGHT = [sys.executable, "-m", "pipelines.cli"]


MERGED_RUN_ARGS = (
    "run",
    "--preset",
    "cpu_smoke",
    "--iterations",
    "1",
    "--resolution",
    "32",
    "--lora-rank",
    "4",
    "--sync-mode",
    "merged",
    "--reward",
    "jpeg_compressibility",
    "--local-workers",
    "1",
    "--preemptions-per-hour",
    "0",
    "--nproc",
    "2",
)


def _run_merged(tmp_path, model) -> subprocess.CompletedProcess:
    """One cpu_smoke iteration of `spotlight run --model` with merged sync, one queue worker and two trainer ranks."""
    run = tmp_path / "run"
    done = subprocess.run(
        [*SPOTLIGHT, *MERGED_RUN_ARGS, "--model", str(model), "--run-dir", str(run)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _ledger_rows(run) -> tuple[list, tuple, list]:
    """(the syncs, the done rollout requests' count / hashed count / first worker, the rollout workers)."""
    import duckdb

    with duckdb.connect(str(run / "ledger.duckdb"), read_only=True) as db:
        syncs = db.execute("SELECT version, kind, dense_bytes, patch_bytes FROM syncs ORDER BY version").fetchall()
        sampled = db.execute(
            "SELECT count(*), count(result_hash), min(worker_id) FROM requests "
            "WHERE kind = 'rollout' AND status = 'done'"
        ).fetchone()
        pool = db.execute("SELECT worker_id FROM workers WHERE role = 'rollout'").fetchall()
    return syncs, sampled, pool


@pytest.mark.nightly
@pytest.mark.slow
def test_run_with_merged_sync_publishes_a_chain_a_fresh_worker_replays(tmp_path):
    from resources.store import open_store
    from workers.model.families.lora import merged_weights
    from workers.rollout.weights import PolicyHolder
    from workers.trainer.checkpoint import load_checkpoint

    done = _run_merged(tmp_path, build_tiny_pipeline("qwen-image", tmp_path / "qwen"))
    run = tmp_path / "run"
    assert "trainer rank 1: joined 1 update(s)" in done.stderr, done.stderr[-3000:]
    assert yaml.safe_load((run / "config.yaml").read_text())["model"]["sync_mode"] == "merged"

    store = open_store(str(run / "store"))
    trained, _ = load_checkpoint(store, "run", 1)
    assert trained.is_lora and trained.model_spec.sync_mode == "merged"  # the checkpoint keeps the adapter
    merged, _ = merged_weights(trained.transformer)
    worker = PolicyHolder(store).policy_at("run", 1)  # anchor v0 + patch v0 -> v1
    assert not worker.is_lora
    received = {k: v.to(torch.bfloat16) for k, v in worker.weights().items()}
    assert set(received) == set(merged) and all(torch.equal(received[k], merged[k]) for k in merged)
    syncs, sampled, pool = _ledger_rows(run)
    assert [s[:2] for s in syncs] == [(0, "anchor"), (1, "patch")]
    assert all(s[2] == sum(t.numel() * 2 for t in merged.values()) for s in syncs)  # the merged transformer
    assert sampled[:2] == (8, 8) and sampled[2].startswith("w0"), sampled  # the queue worker sampled the anchor
    assert pool == [("w0.0",)], pool  # one worker: only rank 0 started the cluster


def test_the_sync_mode_reaches_the_run_context_from_the_deployment_and_the_run_spec(tmp_path):
    """SPOTLIGHT_SYNC_MODE (`dagster dev`) and --sync-mode (`spotlight run`, config.yaml) -> RunConfigResource ->
    RunContext.model, the ModelSpec fields every sync phase publishes with; merged without a LoRA is refused."""
    from assets.context import run_context
    from pipelines.deploy import resources_from_env
    from tests.runs import run_resources

    model = build_tiny_pipeline("qwen-image", tmp_path / "qwen")
    env = {
        "SPOTLIGHT_RUN_DIR": str(tmp_path / "ui"),
        "SPOTLIGHT_PRESET": "cpu_smoke",
        "SPOTLIGHT_MODEL": str(model),
        "SPOTLIGHT_LORA_RANK": "4",
        "SPOTLIGHT_SYNC_MODE": "merged",
    }
    assert run_context(**resources_from_env(env)).model["sync_mode"] == "merged"
    flags = {"preset": "cpu_smoke", "model": str(model), "lora_rank": 4, "sync_mode": "merged"}
    resources = run_resources(tmp_path / "cli", **flags)
    assert run_context(**{k: v for k, v in resources.items()}).model["sync_mode"] == "merged"
    with pytest.raises(ValueError, match="lora_rank > 0"):
        resources_from_env({**env, "SPOTLIGHT_LORA_RANK": "0"})
