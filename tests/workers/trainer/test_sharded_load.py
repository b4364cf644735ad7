"""Two gloo trainer ranks run an iteration's in-process rollout and train phase (workers/coordinator/rollout.py,
train.py) on a tiny Qwen-Image pipeline, against one process on the same checkpoint, under full fine-tuning and
under LoRA:

- every rank samples its half of the requests (the results name the rank that committed them);
- one base per rank: each rank's one `from_pretrained` of the transformer is its resident policy, the one it
  samples with. Under full fine-tuning every rank builds its training copy empty (diffusers `from_config` under
  accelerate's `init_empty_weights`) and receives its shards from rank 0's resident weights; under LoRA every rank
  trains its resident policy in place (the adapters' gradients summed over the ranks), building nothing more;
- the published version 1 equals the one process's within float rounding (the ranks sum gradients in another
  order: tests/workers/trainer/test_fsdp.py); full fine-tuning's AdamW state was stored sharded, LoRA's whole.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch

from tests.procs import run_spawned
from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.trainer.grpo_trainer import TrainConfig

WORLD_SIZE = 2
RUN = "demo"
CONFIG = TrainConfig(
    prompts_per_iteration=2,
    group_size=4,
    reward="jpeg_compressibility",
    sampler=SamplerConfig(num_steps=3, forward_dtype="fp32"),
    grpo=GRPOConfig(objective="flow_grpo", lr=1e-3, clip_range=10.0, num_minibatches=2),
)


def _count_model_builds(calls: list[str]) -> None:
    """Appends "from_pretrained:Class" / "from_config:Class" for every diffusers transformer built in this process
    (a `from_config` inside a `from_pretrained`, how diffusers builds before loading, is not counted again)."""
    from diffusers.configuration_utils import ConfigMixin
    from diffusers.models.modeling_utils import ModelMixin

    pretrained, config = ModelMixin.from_pretrained.__func__, ConfigMixin.from_config.__func__
    loading = [False]

    def counted_pretrained(cls, *args, **kwargs):
        if "Transformer" in cls.__name__:
            calls.append(f"from_pretrained:{cls.__name__}")
        loading[0] = True
        try:
            return pretrained(cls, *args, **kwargs)
        finally:
            loading[0] = False

    def counted_config(cls, *args, **kwargs):
        if "Transformer" in cls.__name__ and not loading[0]:
            calls.append(f"from_config:{cls.__name__}")
        return config(cls, *args, **kwargs)

    ModelMixin.from_pretrained = classmethod(counted_pretrained)
    ConfigMixin.from_config = classmethod(counted_config)


def _rank_main(rank: int, port: int, work: str, lora_rank: int) -> None:
    """Rank 0 runs the rollout and train phases; rank 1 follows its orders. Each writes what it built."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD_SIZE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    from resources.store import open_store
    from workers.coordinator.rollout import collect_in_process
    from workers.coordinator.train import follow_orders, train_iteration
    from workers.trainer.ranks import TrainerSetup, join_ranks, leave_ranks, trainer_setup

    calls: list[str] = []
    _count_model_builds(calls)
    requests = torch.load(Path(work) / "requests.pt", weights_only=False)
    store = open_store(str(Path(work) / "ranks"))
    ranks = join_ranks("cpu")
    with trainer_setup(TrainerSetup(False, ranks)) as setup:
        if rank == 0:
            collect_in_process(store, RUN, CONFIG, 0, requests)
            train_iteration(store, RUN, CONFIG, 0, requests)
            ranks.send(None)
        else:
            follow_orders(setup)
    leave_ranks()
    from workers.bench.memory_ranks import transformers_held

    (Path(work) / f"rank{rank}.json").write_text(json.dumps({"calls": calls, "held": transformers_held()}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", params=[0, 4], ids=["full", "lora"])
def iteration(tmp_path_factory, request):
    """(the work folder, the requests, each rank's model builds) after the ranks' iteration and the one process's."""
    from resources.store import open_store
    from workers.coordinator.rollout import collect_in_process, iteration_requests
    from workers.coordinator.train import train_iteration
    from workers.explore.seed_plan import default_seed_plan
    from workers.model.families.diffusers_policy import load_model_policy
    from workers.model.families.tiny import build_tiny_pipeline
    from workers.trainer import resident
    from workers.trainer.checkpoint import save_checkpoint

    lora_rank = request.param
    work = tmp_path_factory.mktemp("sharded_load")
    policy = load_model_policy(build_tiny_pipeline("qwen-image", work / "qwen"), resolution=32, lora_rank=lora_rank)
    for name in ("ranks", "alone"):
        save_checkpoint(open_store(str(work / name)), RUN, 0, policy)
    requests = iteration_requests(CONFIG, RUN, 0, weights_version=0, plan=default_seed_plan(CONFIG, 0))
    torch.save(requests, work / "requests.pt")
    alone = open_store(str(work / "alone"))
    resident.release_resident()
    try:
        collect_in_process(alone, RUN, CONFIG, 0, requests)
        train_iteration(alone, RUN, CONFIG, 0, requests)
    finally:
        resident.release_resident()
    port = _free_port()
    run_spawned(_rank_main, lambda r: (r, port, str(work), lora_rank), WORLD_SIZE, timeout_s=400)
    return work, requests, [json.loads((work / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)], lora_rank


@pytest.mark.nightly
@pytest.mark.slow  # two spawned ranks importing torch and diffusers, one iteration each way (~1-2 min here)
def test_each_rank_samples_its_half_of_the_requests(iteration):
    from resources.store import open_store
    from workers.coordinator.rollout import load_results

    work, requests, _, _ = iteration
    results = load_results(open_store(str(work / "ranks")), RUN, 0, requests)
    workers = [meta["worker_id"] for _, meta in results]
    half = len(requests) // 2
    assert workers == ["trainer-rank0"] * half + ["trainer-rank1"] * half


@pytest.mark.slow
def test_each_rank_holds_one_base_and_the_update_equals_one_process(iteration):
    from resources.store import open_store
    from workers.trainer.checkpoint import load_checkpoint

    work, _, ranks_built, lora_rank = iteration
    cls = "QwenImageTransformer2DModel"
    for built in ranks_built:
        if lora_rank:  # the resident policy trains in place: nothing else is built
            assert built["calls"] == [f"from_pretrained:{cls}"], built
        else:  # resident to sample; empty to train, filled from rank 0's resident weights
            assert built["calls"] == [f"from_pretrained:{cls}", f"from_config:{cls}"], built
        assert built["held"] == 1, built  # after the update: the resident policy alone, holding version 1
    (ranks, ranks_opt), (alone, alone_opt) = (
        load_checkpoint(open_store(str(work / name)), RUN, 1) for name in ("ranks", "alone")
    )
    base = load_checkpoint(open_store(str(work / "alone")), RUN, 0)[0].weights()
    got, want = ranks.weights(), alone.weights()
    assert max(float((want[k] - base[k]).abs().max()) for k in base) > 1e-4, "the update moved no weight"
    # AdamW's first step moves each weight by lr * g / (|g| + eps): an element whose gradient nearly cancels (the ranks'
    # reduce-scatter sums it in another order) can move by a visible share of lr. Measured on an AMD EPYC, largest
    # difference: 1.4e-5 (ATEN_CPU_CAPABILITY=default), 6.2e-6 (avx2), 2.0e-5 (avx512, one of 12,288 elements;
    # docs/log/kernel-sets.md); a wrong update (a missing shard, another gradient) moves weights by about lr.
    torch.testing.assert_close(got, want, atol=CONFIG.grpo.lr / 20, rtol=1e-4)
    assert ranks_opt.sharded == (lora_rank == 0) and not alone_opt.sharded
    torch.testing.assert_close(ranks_opt.whole_tensors(), alone_opt.tensors, atol=1e-6, rtol=1e-3)
