"""`spotlight bench memory --nproc N`: each trainer rank's peak RSS through one iteration of the real phases (the
in-process rollout on every rank's resident policy, then the update), against one process running the same.

Each rank runs what `spotlight train --nproc N` runs (workers/coordinator): rank 0 publishes the base as version 0
and keeps it as its resident policy, orders the ranks to sample their parts (`collect_in_process`) and to train
(`train_iteration`); the others follow (`follow_orders`). Under LoRA every rank trains its resident policy in place,
so a rank holds one base; under full fine-tuning it holds its resident policy and its FSDP2 shards. After the update
each process counts the whole transformers it still holds (`transformers_held`: parameters not on the meta device).
The reference is the same iteration in one process without ranks (`alone`), its peak "one copy's".

Example:
    figures = run_ranks_bench(RanksBench(model="/tmp/qwen-real-1", nproc=2))
    figures["ratio_max"]          # the largest rank's peak RSS over the one process's
"""

from __future__ import annotations

import dataclasses
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from workers.bench.memory import peak_rss_bytes, rss_bytes

RUN = "memory-ranks"


@dataclass(frozen=True)
class RanksBench:
    model: str
    """A diffusers pipeline folder (e.g. `build_tiny_pipeline("qwen-image", DIR, widths="real", num_layers=1)`)."""
    nproc: int = 2
    lora_rank: int = 64
    """0: full fine-tuning (FSDP2 over the ranks)."""
    resolution: int = 128
    group_size: int = 2
    num_steps: int = 2
    guidance: float = 4.5
    """True CFG as the GPU presets run it: two transformer passes per step."""
    threads: int = 1

    def __post_init__(self):
        if self.nproc < 2:
            raise ValueError(f"nproc must be >= 2 (the ranks compared with one process), got {self.nproc}")
        if not (Path(self.model) / "model_index.json").is_file():
            raise ValueError(f"model {self.model} is not a diffusers pipeline folder (no model_index.json)")

    def train_config(self):
        from workers.algo.grpo import GRPOConfig
        from workers.algo.sampler import SamplerConfig
        from workers.trainer.grpo_trainer import TrainConfig

        return TrainConfig(
            iterations=1,
            prompts_per_iteration=self.nproc,
            group_size=self.group_size,
            reward="jpeg_compressibility",
            sampler=SamplerConfig(num_steps=self.num_steps, noise_level=1.2, forward_dtype="fp32"),
            grpo=GRPOConfig(lr=3e-4, clip_range=1e-4, adv_clip=5.0, kl_beta=0.0, num_minibatches=1),
            rollout_batch=self.group_size,
            micro_batch=1,
        )


def transformers_held() -> int:
    """Whole transformers alive in this process (diffusers models whose parameters are allocated)."""
    import gc

    from diffusers import ModelMixin

    return sum(
        1
        for obj in gc.get_objects()
        if isinstance(obj, ModelMixin)
        and type(obj).__name__.endswith("Transformer2DModel")
        and not any(p.is_meta or type(p).__name__ == "DTensor" for p in obj.parameters())
    )


def one_iteration(bench: RanksBench, store_root: str, distributed: bool) -> dict:
    """One iteration's rollout and update in this process (a rank of `bench.nproc` when `distributed`); this
    process's figures, or with ranks every rank's (on rank 0)."""
    import torch
    import torch.distributed as dist

    from resources.store.local import LocalTensorStore
    from workers.coordinator.rollout import collect_in_process, iteration_requests
    from workers.coordinator.train import follow_orders, train_iteration
    from workers.explore.seed_plan import plan_for_iteration
    from workers.model.policy_loader import load_any
    from workers.trainer.checkpoint import save_checkpoint
    from workers.trainer.ranks import TrainerSetup, join_ranks, leave_ranks, trainer_setup
    from workers.trainer.resident import adopt

    torch.set_num_threads(bench.threads)
    ranks = join_ranks("cpu") if distributed else None
    store, config = LocalTensorStore(store_root), bench.train_config()
    setup = TrainerSetup(gradient_checkpointing=True, ranks=ranks)
    figures: dict = {"rank": 0 if ranks is None else ranks.rank}
    with trainer_setup(setup):
        if ranks is None or ranks.rank == 0:
            policy = load_any(
                bench.model,
                lora_rank=bench.lora_rank,
                resolution=bench.resolution,
                guidance=bench.guidance,
                base_dtype="fp32",
            )
            save_checkpoint(store, RUN, 0, policy)
            adopt(policy, policy.spec(), store, RUN, 0)
            figures["base_GB"] = round(sum(p.numel() * 4 for p in policy.transformer.parameters()) / 1e9, 3)
            figures["rss_after_load_GB"] = round(rss_bytes() / 1e9, 3)
            requests = iteration_requests(config, RUN, 0, 0, plan_for_iteration(store, RUN, config, 0))
            collect_in_process(store, RUN, config, 0, requests)
            figures["stats"] = train_iteration(store, RUN, config, 0, requests)
            if ranks is not None:
                ranks.send(None)
        else:
            follow_orders(setup)
    figures["peak_rss_GB"] = round(peak_rss_bytes() / 1e9, 3)
    figures["transformers_held"] = transformers_held()
    if ranks is None:
        return figures
    every: list = [None] * ranks.world_size
    dist.all_gather_object(every, figures, group=ranks.orders)
    leave_ranks()
    return {"ranks": every}


def _alone(bench: RanksBench, store_root: str) -> dict:
    return one_iteration(bench, store_root, distributed=False)


def run_ranks_bench(bench: RanksBench, progress=lambda line: None) -> dict:
    """The iteration in one fresh process, then over `bench.nproc` ranks; every peak and the ratios."""
    from workers.trainer.launch import launch

    with tempfile.TemporaryDirectory(prefix="spotlight-ranks-") as folder:
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
            alone = pool.submit(_alone, bench, f"{folder}/alone").result()
        progress(f"one process: peak RSS {alone['peak_rss_GB']} GB")
        ranks = launch(bench.nproc, one_iteration, bench, f"{folder}/ranks", True)["ranks"]
    for rank in ranks:
        rank["ratio_to_one_process"] = round(rank["peak_rss_GB"] / alone["peak_rss_GB"], 3)
        progress(f"rank {rank['rank']}: peak RSS {rank['peak_rss_GB']} GB ({rank['ratio_to_one_process']}x)")
    return {
        "bench": dataclasses.asdict(bench),
        "alone": alone,
        "ranks": ranks,
        "ratio_max": max(r["ratio_to_one_process"] for r in ranks),
        "transformers_held_max": max(r["transformers_held"] for r in [alone, *ranks]),
    }


def format_ranks_report(figures: dict) -> str:
    b, alone = figures["bench"], figures["alone"]
    mode = f"LoRA r={b['lora_rank']}" if b["lora_rank"] else "full fine-tuning"
    lines = [
        f"{mode}, {b['nproc']} gloo ranks, {b['resolution']} px, guidance {b['guidance']}; "
        f"one base {alone['base_GB']} GB",
        f"{'process':>10} {'peak RSS GB':>12} {'x one process':>14} {'transformers held':>18}",
        f"{'alone':>10} {alone['peak_rss_GB']:>12} {1.0:>14} {alone['transformers_held']:>18}",
    ]
    for r in figures["ranks"]:
        lines.append(
            f"{'rank ' + str(r['rank']):>10} {r['peak_rss_GB']:>12} {r['ratio_to_one_process']:>14} "
            f"{r['transformers_held']:>18}"
        )
    return "\n".join(lines)
