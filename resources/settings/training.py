"""The settings of what a run trains and how: preset, model, prompts, validation, the reward-hacking guard, batch
shape, exploration and the trainer's processes. Shared by `spotlight run`, `spotlight train` and the Dagster
resource."""

from __future__ import annotations

from typing import Optional

from resources.settings.base import Advantage, OnHacking, SyncMode
from resources.settings.base import setting as _s

_PRESETS_DEFAULT = "the preset's"
TRAINING = (
    _s("preset", str, "cpu_tiny_spot", "Training preset (workers/trainer/presets.py)."),
    _s("iterations", Optional[int], None, f"Training iterations (default: {_PRESETS_DEFAULT}).", bounds={"ge": 1}),
    _s(
        "seed",
        Optional[int],
        None,
        "Run seed: the prompt schedule and every request's seed (default: the preset's).",
        bounds={"ge": 0},
    ),
    _s(
        "reward",
        Optional[str],
        None,
        "Reward overriding the preset's: a name (minigeneval, minigeneval_strict, jpeg_compressibility), clip:PATH, "
        "multi:a=1,b=0.1, or a reward server's http:// URL (docs/MODELS.md).",
    ),
    _s(
        "checkpoint",
        Optional[str],
        None,
        "Policy folder to start from (default: the shipped base).",
        path=True,
    ),
    _s("device", str, "cpu", "Where the trainer, in-process sampling and validation run: cpu, cuda or cuda:N."),
    _s(
        "model",
        Optional[str],
        None,
        "A diffusers pipeline folder to post-train instead (Qwen-Image, SD3/3.5, FLUX.1), loaded locally by the "
        "trainer and every worker; nothing is downloaded (docs/MODELS.md).",
        path=True,
    ),
    _s(
        "lora_rank",
        Optional[int],
        None,
        "With --model: LoRA rank (0 = full fine-tuning; default: the preset's, else 0).",
        bounds={"ge": 0},
    ),
    _s(
        "resolution",
        Optional[int],
        None,
        "With --model: image side in pixels (default: the preset's, else 512).",
        bounds={"ge": 1},
    ),
    _s(
        "guidance",
        Optional[float],
        None,
        "With --model: true-CFG scale, or FLUX.1-dev's guidance.",
        bounds={"ge": 0},
    ),
    _s(
        "sync_mode",
        Optional[SyncMode],
        None,
        "With --model and a LoRA: what PULSE ships to the rollout workers, lora (the adapter; default) or merged "
        "(BF16 base + LoRA delta of every weight: workers need no adapter).",
    ),
    _s(
        "prompts",
        Optional[str],
        None,
        'Training prompts from a file: text (one a line, # comments), JSON Lines ({"prompt": ...} plus fields '
        "handed to the reward), Parquet or a Hugging Face datasets folder (default: MiniGenEval's grammar). Drawn "
        "per iteration by the run seed; checked before any weights load.",
        path=True,
    ),
    _s(
        "prompts_heldout",
        Optional[float],
        None,
        "With --prompts: share of its prompts held out (by a fixed hash of each prompt) to validate on, unless "
        "--validation-prompts is given.",
        bounds={"ge": 0, "lt": 1},
    ),
    _s(
        "validation_reward",
        Optional[str],
        None,
        "Reward that scores the held-out images, averaged over prompts x fixed seeds (default: MiniGenEval's "
        "detector for the pixel policy; with --model the run's reward).",
    ),
    _s(
        "validation_prompts",
        Optional[str],
        None,
        "A text file of held-out prompts, one a line, # for comments (default: MiniGenEval's held-out split; the "
        "pixel policy reads only MiniGenEval prompts).",
        path=True,
    ),
    _s(
        "on_hacking",
        OnHacking,
        "warn",
        "When the reward-hacking guard flags a validation (docs/REWARD_HACKING.md): warn (record it, fail the "
        "Dagster check), stop (end the run after that iteration; resumable) or rollback (continue from the "
        "best-gold weights at a lower lr / stronger KL).",
    ),
    _s(
        "hacking_window",
        Optional[int],
        None,
        "Validations back the guard compares the proxy and gold rewards over (default 2).",
        bounds={"ge": 1},
    ),
    _s(
        "hacking_z",
        Optional[float],
        None,
        "Standard errors the proxy's rise and the gold's fall must each exceed (default 2).",
        bounds={"ge": 0},
    ),
    _s(
        "hacking_max_drop",
        Optional[float],
        None,
        "Largest relative fall of a held-out image statistic below the base's (default 0.5; 0 = off).",
        bounds={"ge": 0, "lt": 1},
    ),
    _s(
        "hacking_max_rise",
        Optional[float],
        None,
        "Largest relative rise of a held-out image statistic above the base's (default: rises never fire).",
        bounds={"gt": 0},
    ),
    _s(
        "rollback_lr_scale",
        Optional[float],
        None,
        "With --on-hacking rollback: learning-rate factor per rollback (default 0.5).",
        bounds={"gt": 0, "le": 1},
    ),
    _s(
        "rollback_kl_beta",
        Optional[float],
        None,
        "With --on-hacking rollback: train on with at least this KL coefficient (default: the preset's).",
        bounds={"ge": 0},
    ),
    _s(
        "rollout_batch",
        Optional[int],
        None,
        "Samples sampled and VAE-decoded together where this process samples (rollout, exploration, validation); "
        "memory follows this chunk, not the iteration (default: the preset's; none = all).",
        bounds={"ge": 1},
    ),
    _s(
        "micro_batch",
        Optional[int],
        None,
        "Samples per forward and backward in the update: each minibatch's gradients accumulate over micro-batches "
        "of this many, the same step in less activation memory (default: the preset's).",
        bounds={"ge": 1},
    ),
    _s(
        "group_size",
        Optional[int],
        None,
        "Samples per prompt the update compares (GRPO's group; default: the preset's).",
        bounds={"ge": 2},
    ),
    _s(
        "prompts_per_iteration",
        Optional[int],
        None,
        "Prompts sampled per iteration (default: the preset's).",
        bounds={"ge": 1},
    ),
    _s(
        "minibatches",
        Optional[int],
        None,
        "Optimizer steps per epoch: the iteration's samples split into this many minibatches (default: the preset's).",
        bounds={"ge": 1},
    ),
    _s(
        "advantage",
        Optional[Advantage],
        None,
        "What the advantages normalise within each group: total (the reward; the preset's default) or "
        "per-component (each component of a multi: reward, then weighted, so a component with a small spread is "
        "not drowned; docs/REWARD_HACKING.md).",
    ),
    _s(
        "explore_samples",
        Optional[float],
        None,
        "In-process sampling: explore the next iteration's seeds on the stale weights within this many "
        "full-sampler samples per iteration (docs/EXPLORATION.md); queue workers explore on their own time.",
        bounds={"gt": 0},
        resource=False,
    ),
    _s(
        "nproc",
        int,
        1,
        "Trainer processes: each update is sharded over them with FSDP2 (NCCL, one GPU each, with --device cuda; "
        "gloo ranks on cpu). Every rank samples its share of the in-process rollout; rank 0 also runs the rest of "
        "the run: validation, exploration, the ledger and the store's writes.",
        env="",
        resource=False,
    ),
    _s(
        "gradient_checkpointing",
        Optional[bool],
        None,
        "Recompute each transformer block in backward: less activation memory, about one more forward (default: "
        "on for the GPU presets).",
        flag="--gradient-checkpointing/--no-gradient-checkpointing",
        env="",
        resource=False,
    ),
)
