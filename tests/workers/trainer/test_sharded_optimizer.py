"""AdamW state saved and restored sharded (workers/trainer/sharded_optimizer.py) by two gloo ranks under FSDP2.

Two updates in a row on two ranks, against the same two updates with the state saved to the store after the first
and restored, each rank its own shards, into a fresh policy and trainer: the weights must match (the same kernels in
the same order; checked to 1e-7). DCP's own metadata must put each AdamW moment's two halves in the two ranks'
files, and the shards read back whole in one process must be what that process's AdamW holds after the same update.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.procs import run_spawned
from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.trainer.fsdp import full_weights
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig

WORLD_SIZE = 2
CONFIG = TrainConfig(
    prompts_per_iteration=2,
    group_size=4,
    reward="jpeg_compressibility",
    sampler=SamplerConfig(num_steps=3, forward_dtype="fp32"),
    grpo=GRPOConfig(objective="flow_grpo", lr=1e-3, clip_range=10.0, num_minibatches=2),
)
CHECKPOINT_KEY = "runs/sharded/weights/v000001"


def _policy():
    from workers.model.tiny_policy import PolicyConfig, build_policy

    config = PolicyConfig(image_size=16, num_layers=1, num_heads=2, head_dim=16, text_dim=32, rope_axes=(4, 6, 6))
    return build_policy(config, seed=0).eval()


def _distributed_trainer(weights: dict, mesh) -> GRPOTrainer:
    from workers.trainer.fsdp import distribute

    policy = _policy()
    policy.load_weights(weights)
    return distribute(GRPOTrainer(policy, CONFIG), mesh)


def _rank_main(rank: int, init_file: str, work: str) -> None:
    """Two updates uninterrupted, then the same two with a sharded save and restore between them."""
    torch.set_num_threads(1)
    from resources.store import open_store
    from workers.trainer.fsdp import init_distributed
    from workers.trainer.sharded_optimizer import load_sharded, save_sharded

    mesh = init_distributed("cpu", f"file://{init_file}", rank, WORLD_SIZE)
    saved = torch.load(Path(work) / "inputs.pt", weights_only=False)
    store = open_store(str(Path(work) / "store"))
    uninterrupted = _distributed_trainer(saved["initial"], mesh)
    for batch in saved["batches"]:
        uninterrupted.update(batch)
    first = _distributed_trainer(saved["initial"], mesh)
    first.update(saved["batches"][0])
    meta = save_sharded(store, CHECKPOINT_KEY, first.optimizer)
    after_first = full_weights(first.policy)
    resumed = _distributed_trainer(after_first, mesh)
    load_sharded(store, meta, resumed.optimizer)
    resumed.update(saved["batches"][1])
    result = {"uninterrupted": full_weights(uninterrupted.policy), "resumed": full_weights(resumed.policy)}
    torch.save({**result, "meta": meta}, Path(work) / f"rank{rank}.pt")
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def ranks_result(tmp_path_factory):
    """(each rank's result, the one process's AdamW state after the first update, the work folder)."""
    work = tmp_path_factory.mktemp("sharded")
    policy = _policy()
    initial = {k: v.clone() for k, v in policy.weights().items()}
    trainer = GRPOTrainer(policy, CONFIG)
    batches = [trainer.collect(0), trainer.collect(1)]
    assert all(b.advantages.abs().sum() > 0 for b in batches), "the batches need reward contrast"
    torch.save({"initial": initial, "batches": batches}, work / "inputs.pt")
    trainer.update(batches[0])
    alone = trainer.optimizer.state_dict()
    run_spawned(_rank_main, lambda r: (r, str(work / "init"), str(work)), WORLD_SIZE, timeout_s=300)
    return [torch.load(work / f"rank{r}.pt", weights_only=False) for r in range(WORLD_SIZE)], alone, work


@pytest.mark.slow  # two spawned processes importing torch (~30 s on 2 idle cores)
def test_a_run_resumed_from_sharded_optimizer_state_continues_as_if_uninterrupted(ranks_result):
    results, _, _ = ranks_result
    initial = _policy().weights()
    for result in results:
        moved = max(float((result["uninterrupted"][k] - initial[k]).abs().max()) for k in initial)
        assert moved > 1e-4, "the updates must move the weights for the comparison to mean anything"
        torch.testing.assert_close(result["resumed"], result["uninterrupted"], atol=1e-7, rtol=0)


def _stored_chunks(store, prefix: str, folder: Path) -> dict[str, list[tuple[str, int]]]:
    """Per state tensor of the stored DCP folder: (file, dim-0 rows) of each chunk, read from DCP's own metadata."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import MetadataIndex

    for key in store.list_keys(prefix):
        name = key[len(prefix) :]
        (folder / (".metadata" if name == "metadata" else name)).write_bytes(store.get_bytes(key))
    metadata = dcp.FileSystemReader(str(folder)).read_metadata()
    return {
        key: [
            (metadata.storage_data[MetadataIndex(key, chunk.offsets)].relative_path, chunk.sizes[0])
            for chunk in item.chunks
        ]
        for key, item in metadata.state_dict_metadata.items()
        if len(item.size) > 0
    }


@pytest.mark.slow
def test_each_rank_stores_only_its_shard_and_the_shards_read_back_whole(ranks_result, tmp_path):
    from resources.store import open_store
    from workers.trainer.checkpoint import OptimizerState, split_optimizer
    from workers.trainer.sharded_optimizer import dcp_prefix

    results, alone, work = ranks_result
    store = open_store(str(work / "store"))
    chunks = _stored_chunks(store, dcp_prefix(CHECKPOINT_KEY), tmp_path)
    whole = split_optimizer(alone)
    moments = [k for k in whole.tensors if k.endswith((".exp_avg", ".exp_avg_sq"))]
    assert moments and set(moments) <= set(chunks)
    for key in moments:  # each AdamW moment in two halves, each in its own rank's file
        files = sorted(file for file, _ in chunks[key])
        assert files == ["__0_0.distcp", "__1_0.distcp"], (key, chunks[key])
        assert sum(rows for _, rows in chunks[key]) == whole.tensors[key].shape[0]
    read_back = OptimizerState({}, results[0]["meta"], store).whole_tensors()
    assert set(read_back) == set(whole.tensors)  # the one-process checkpoint's keys: resumable on any number of ranks
    torch.testing.assert_close(read_back, whole.tensors, atol=1e-6, rtol=1e-3)
