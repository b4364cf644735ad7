"""The run's config tree: one pydantic model per section, written out, each field declared once with its type,
default, bounds and help.

Everything a user sets goes through this tree: the flags of `spotlight run`, `spotlight train` and `spotlight config`,
the keys of a `--config run.yaml` (nested or dotted), the SPOTLIGHT_* variables, the Dagster launchpad's fields and the
config a cloud node or a rollout worker receives are all derived from it (resources/settings/surface.py), and a
preset is a whole `RunConfig` (workers/trainer/presets.py). A field's flag is `--<field name with dashes>` unless
its `json_schema_extra` names another; field names are unique across sections, so a flag, a variable
(`SPOTLIGHT_<NAME>`) and a flat file key each name one field.

Example:
    config = RunConfig(preset="cpu_smoke", train=TrainSection(iterations=2, group_size=4))
    config.train.group_size, config.workers.lease_s
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from resources.settings.base import Advantage, OnHacking, SyncMode
from resources.settings.sections import (
    AdvNorm,
    BaseDtype,
    ForwardDtype,
    KlForm,
    LrSchedule,
    NftWeighting,
    Objective,
    Section,
    _path,
)
from resources.settings.sections_ops import DeploymentSection, WorkersSection


class ModelSection(Section):
    """What is trained: the shipped pixel policy (or a policy folder), or a diffusers pipeline folder."""

    model: Optional[str] = Field(
        None,
        **_path(
            "A diffusers pipeline folder to post-train (Qwen-Image, SD3/3.5, FLUX.1), loaded locally by the trainer "
            "and every worker; nothing is downloaded (docs/MODELS.md). Unset: the pixel policy."
        ),
    )
    checkpoint: Optional[str] = Field(
        None, **_path("A spotlight policy folder to start from (default: the shipped base); not with model.")
    )
    lora_rank: int = Field(0, ge=0, description="With model: LoRA rank (0 = full fine-tuning).")
    lora_alpha: Optional[float] = Field(None, gt=0, description="With model: LoRA alpha (unset: the rank).")
    resolution: int = Field(512, ge=16, description="With model: image side in pixels.")
    guidance: float = Field(1.0, ge=0, description="With model: true-CFG scale, or FLUX.1-dev's guidance.")
    negative_prompt: Optional[str] = Field(
        None, description="With model: the negative prompt of true CFG (a prompts file row's negative_prompt wins)."
    )
    eval_guidance: Optional[float] = Field(
        None,
        ge=0,
        description="With model: the guidance validation samples with (flow_grpo's sample.eval_guidance_scale; "
        "unset: guidance). Guidance 1 with this set: CFG-free training, guided evaluation.",
    )
    max_sequence_length: int = Field(512, ge=1, description="With model: text encoder tokens per prompt.")
    base_dtype: BaseDtype = Field("fp32", description="With model: dtype of the frozen base weights.")
    sync_mode: SyncMode = Field(
        "lora",
        description="With model and a LoRA: what PULSE ships to the rollout workers, lora (the adapter) or merged "
        "(BF16 base + LoRA delta of every weight: workers need no adapter).",
    )


MODEL_ONLY_FIELDS = (
    "lora_rank",
    "lora_alpha",
    "resolution",
    "guidance",
    "negative_prompt",
    "eval_guidance",
    "max_sequence_length",
    "base_dtype",
    "sync_mode",
)
"""The model fields that apply to a diffusers pipeline only: set by a user without `model`, they are refused."""


class TrainSection(Section):
    """What the update trains on and how: the task, the batch shape and the GRPO / NFT recipe."""

    iterations: int = Field(40, ge=1, description="Training iterations.")
    seed: int = Field(0, ge=0, description="Run seed: the prompt schedule and every request's seed.")
    reward: str = Field(
        "minigeneval",
        description="Reward: a name (minigeneval, minigeneval_strict, jpeg_compressibility), clip:PATH, "
        'multi:a=1,b=0.1, or a reward server\'s http:// URL (docs/MODELS.md); "" = none chosen (a GPU preset).',
    )
    prompts: Optional[str] = Field(
        None,
        **_path(
            'Training prompts from a file: text (one a line, # comments), JSON Lines ({"prompt": ...} plus fields '
            "handed to the reward), Parquet or a Hugging Face datasets folder (default: MiniGenEval's grammar)."
        ),
    )
    prompts_heldout: float = Field(
        0.0, ge=0, lt=1, description="With prompts: share of its prompts held out (by a fixed hash) to validate on."
    )
    train_categories: Optional[tuple[str, ...]] = Field(
        None, description="MiniGenEval only: train on prompts of these categories (unset: all)."
    )
    prompts_per_iteration: int = Field(8, ge=1, description="Prompts sampled per iteration.")
    group_size: int = Field(8, ge=2, description="Samples per prompt the update compares (GRPO's group).")
    rollouts_per_prompt: Optional[int] = Field(
        None,
        ge=2,
        description="Samples drawn per prompt; the update keeps the group_size of largest reward variance "
        "(unset: group_size).",
    )
    minibatches: int = Field(2, ge=1, description="Optimizer steps per epoch: the iteration's samples in this many.")
    epochs: int = Field(1, ge=1, description="Passes over each iteration's rollouts.")
    micro_batch: Optional[int] = Field(
        None,
        ge=1,
        description="Samples per forward and backward in the update (gradients accumulate; unset: the minibatch).",
    )
    objective: Objective = Field(
        "flow_grpo", description="flow_grpo (PPO-clip on SDE log-probs) or nft (advantage-weighted flow matching)."
    )
    lr: float = Field(5e-5, gt=0, description="AdamW learning rate.")
    lr_warmup_steps: int = Field(0, ge=0, description="Optimizer steps of linear learning-rate warm-up.")
    lr_schedule: LrSchedule = Field("constant", description="After the warm-up: constant or cosine.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient norm clip.")
    clip_range: float = Field(1e-4, gt=0, description="flow_grpo: PPO ratio clip.")
    adv_clip: float = Field(5.0, gt=0, description="Advantages are clipped to [-adv_clip, adv_clip].")
    adv_norm: AdvNorm = Field(
        "group",
        description="What divides the deviation from the group mean: group (its std), batch (the deviations' RMS) "
        "or global_std (the std of every reward in the batch: flow_grpo's sample.global_std).",
    )
    advantage: Advantage = Field(
        "total",
        description="What the advantages normalise within each group: total (the reward) or per-component (each "
        "component of a multi: reward, then weighted; docs/REWARD_HACKING.md).",
    )
    kl_beta: float = Field(0.0, ge=0, description="Weight of the KL to the base policy (beta; 0 skips it).")
    kl_form: KlForm = Field("step", description="flow_grpo: the KL's form, step or flow_grpo (flow_grpo's code).")
    nft_beta: float = Field(1.0, gt=0, le=10, description="nft: step of the implicit policies.")
    nft_timesteps: int = Field(2, ge=1, description="nft: noise levels per sample and update.")
    nft_adv_scale: float = Field(2.0, gt=0, description="nft: advantage that maps to optimality 1 / 0.")
    nft_weighting: NftWeighting = Field("velocity", description="nft: velocity or adaptive (DiffusionNFT's).")
    device: str = Field("cpu", description="Where the trainer, in-process sampling and validation run: cpu, cuda:N.")
    nproc: int = Field(
        1,
        ge=1,
        description="Trainer processes; each update is split over them (LoRA: whole base per rank, "
        "adapter gradients summed; full fine-tuning: FSDP2 shards).",
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute each transformer block in backward: less memory, one more forward."
    )
    ema: bool = Field(
        False,
        description="Keep an EMA of the trained weights (flow_grpo's train.ema): validation scores it and each "
        "checkpoint saves it; rollouts sample the live weights.",
    )
    ema_decay: float = Field(
        0.9, ge=0, lt=1, description="With ema: the decay, min((1+k)/(10+k), ema_decay) at step k."
    )
    ema_every: int = Field(8, ge=1, description="With ema: optimizer steps between EMA updates.")
    gpu_memory_gb: Optional[float] = Field(
        None,
        gt=0,
        description="With model: GB of memory per GPU for the memory plan (spotlight config --memory); a run that "
        "cannot fit is refused before weights load (unset: the GPU's own size on CUDA, else no check).",
    )


class SamplingSection(Section):
    """How rollouts are sampled: the sampler and the chunks a process samples in."""

    num_steps: int = Field(8, ge=1, description="Denoising steps.")
    noise_level: float = Field(0.7, ge=0, description="SDE noise level (0: the deterministic ODE).")
    shift: float = Field(1.0, gt=0, description="Timestep shift of the flow schedule.")
    sde_window: Optional[tuple[int, int]] = Field(
        None, description="Steps [start, end) that are SDE steps (unset: every step)."
    )
    sde_window_size: Optional[int] = Field(
        None,
        ge=1,
        description="SDE steps in a window placed at random each iteration within sde_window_range (flow_grpo's "
        "sample.sde_window_size; unset: sde_window, fixed).",
    )
    sde_window_range: Optional[tuple[int, int]] = Field(
        None, description="With sde_window_size: steps [low, high) the random window stays in (unset: every step)."
    )
    init_same_noise: bool = Field(
        False,
        description="Every sample of a prompt's group starts from one initial noise (flow_grpo's same_latent, "
        "DanceGRPO's init_same_noise); the SDE noise stays each sample's own. Not with explore.",
    )
    forward_dtype: ForwardDtype = Field("auto", description="Dtype of the transformer's forward: auto, fp32, bf16.")
    rollout_batch: Optional[int] = Field(
        None,
        ge=1,
        description="Samples sampled and VAE-decoded together where this process samples; memory follows this "
        "chunk (unset: all at once).",
    )
    seeds_per_request: int = Field(
        1, ge=1, le=256, description="Queue workers: samples of one prompt per rollout request, sampled as a batch."
    )

    @model_validator(mode="after")
    def _window_in_steps(self) -> "SamplingSection":
        if self.sde_window is not None and not 0 <= self.sde_window[0] < self.sde_window[1] <= self.num_steps:
            raise ValueError(f"sde_window {self.sde_window} must satisfy 0 <= start < end <= num_steps")
        if self.sde_window_size is not None:
            if self.sde_window is not None:
                raise ValueError("sampling.sde_window (fixed) and sampling.sde_window_size (placed at random): set one")
            low, high = self.window_range
            if not 0 <= low < high <= self.num_steps or high - low < self.sde_window_size:
                raise ValueError(
                    f"sampling.sde_window_range {self.window_range} must satisfy 0 <= low < high <= num_steps and "
                    f"span at least sde_window_size={self.sde_window_size} steps"
                )
        elif self.sde_window_range is not None:
            raise ValueError("sampling.sde_window_range applies with sampling.sde_window_size: set both")
        return self

    @property
    def window_range(self) -> tuple[int, int]:
        """The steps a random SDE window stays in (sde_window_range, or every step)."""
        return self.sde_window_range or (0, self.num_steps)


class ExploreSection(Section):
    """SPOTLIGHT's seed exploration on the stale weights, beside training (docs/EXPLORATION.md)."""

    explore: bool = Field(True, description="Queue workers explore the next iteration's seeds beside training.")
    explore_samples: Optional[float] = Field(
        None,
        gt=0,
        description="rollouts inprocess: explore in this process within this many full-sampler samples per "
        "iteration (unset: in-process runs do not explore).",
    )
    seed_multipliers: tuple[int, ...] = Field(
        (2, 3, 4),
        min_length=1,
        description="The bandit's arms: candidate seeds per prompt, as multiples of group_size.",
    )
    cache_levels: tuple[str, ...] = Field(
        ("fbcache", "half_steps", "quarter_steps"),
        min_length=1,
        description="The bandit's arms: cheap sampler levels to rank candidates with (workers/explore/request.py).",
    )
    keep_factor: float = Field(
        1.0, ge=1, description="Explored seeds kept per group, as a multiple of group_size (> 1: a pre-filter)."
    )
    explore_budget_rollouts: Optional[float] = Field(
        None,
        gt=0,
        description="Queue workers: stop exploring on a request budget of this many rollouts' worth of samples, so a "
        "run seed is the same run whatever the load (unset: when training ends).",
    )
    control_prompts: int = Field(0, ge=0, description="Prompts per iteration kept on their default seeds.")
    min_arm_tau: Optional[float] = Field(
        None, description="Drop a bandit arm whose stale-vs-fresh Kendall tau falls below this (unset: never)."
    )


class ValidationSection(Section):
    """Held-out validation and the report."""

    validate_every: int = Field(5, ge=1, description="Score the held-out split every this many iterations.")
    validation_seeds: int = Field(2, ge=1, description="Fixed seeds per held-out prompt.")
    validation_max_prompts: Optional[int] = Field(
        None,
        ge=1,
        description="Score only this many held-out prompts, spread evenly over the held-out list (unset: all); a "
        "quick check's setting, since a score over fewer prompts is noisier.",
    )
    validation_steps: Optional[int] = Field(
        None,
        ge=1,
        description="Denoising steps of validation's ODE sampler (flow_grpo's eval_num_steps; unset: num_steps).",
    )
    validation_reward: Optional[str] = Field(
        None,
        description="Reward that scores held-out images (unset: MiniGenEval's detector for the pixel policy; with "
        "model the run's reward).",
    )
    validation_prompts: Optional[str] = Field(
        None, **_path("A text file of held-out prompts, one a line (default: MiniGenEval's held-out split).")
    )
    max_validation_drop: float = Field(
        0.25, ge=0, description="The validation check fails when the held-out score falls this far below the base's."
    )
    report_every: Optional[int] = Field(
        None, ge=1, description="Rewrite the report every this many iterations (unset: validate_every, at most 5)."
    )


class GuardSection(Section):
    """The reward-hacking guard (docs/REWARD_HACKING.md)."""

    on_hacking: OnHacking = Field(
        "warn", description="When the guard flags a validation: warn, stop (resumable) or rollback."
    )
    hacking_window: int = Field(2, ge=1, description="Validations back the proxy/gold comparison reaches.")
    hacking_z: float = Field(2.0, ge=0, description="Standard errors the proxy's rise and gold's fall must exceed.")
    hacking_max_drop: float = Field(
        0.5, ge=0, lt=1, description="Largest relative fall of a held-out image statistic (0 = off)."
    )
    hacking_max_rise: Optional[float] = Field(
        None, gt=0, description="Largest relative rise of a held-out image statistic (unset: never fires)."
    )
    rollback_lr_scale: float = Field(0.5, gt=0, le=1, description="rollback: learning-rate factor per rollback.")
    rollback_kl_beta: Optional[float] = Field(
        None, ge=0, description="rollback: train on with at least this KL coefficient (unset: the run's)."
    )


class RunConfig(BaseModel):
    """A whole run: the preset it started from and every section, resolved."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str = Field("cpu_tiny_spot", description="The preset this config starts from (spotlight config --list).")
    model: ModelSection = Field(default_factory=ModelSection)
    train: TrainSection = Field(default_factory=TrainSection)
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    explore: ExploreSection = Field(default_factory=ExploreSection)
    validation: ValidationSection = Field(default_factory=ValidationSection)
    guard: GuardSection = Field(default_factory=GuardSection)
    workers: WorkersSection = Field(default_factory=WorkersSection)
    deployment: DeploymentSection = Field(default_factory=DeploymentSection)

    @model_validator(mode="after")
    def _combinations(self) -> "RunConfig":
        """Combinations of fields from different sections that cannot run together."""
        train, sampling = self.train, self.sampling
        if train.rollouts_per_prompt is not None and train.rollouts_per_prompt < train.group_size:
            raise ValueError(
                f"train.rollouts_per_prompt={train.rollouts_per_prompt} must be >= train.group_size={train.group_size}"
            )
        if train.minibatches > train.prompts_per_iteration * train.group_size:
            raise ValueError(f"train.minibatches={train.minibatches} exceeds the samples per iteration")
        if train.objective == "flow_grpo" and sampling.noise_level == 0:
            raise ValueError(
                "train.objective flow_grpo needs sampling.noise_level > 0 (the ODE has no log-probs); use "
                "train.objective nft to train on ODE rollouts"
            )
        if self.model.model is not None and self.model.checkpoint is not None:
            raise ValueError("model.model (a diffusers pipeline) and model.checkpoint (a spotlight policy): set one")
        if train.prompts is not None and train.train_categories is not None:
            raise ValueError("train.train_categories picks MiniGenEval categories: leave it unset with train.prompts")
        if self.explore.explore_samples is not None and self.deployment.rollouts != "inprocess":
            raise ValueError(
                f"explore.explore_samples (a budget in samples) is for deployment.rollouts inprocess, not "
                f"{self.deployment.rollouts!r}: queue workers explore on their own time"
            )
        workers = self.workers
        if workers.local_workers == 0 and self.deployment.rollouts in ("local_pool", "local_cluster"):
            if not (self.deployment.queue or "").startswith(("redis://", "rediss://")):
                raise ValueError(
                    "workers.local_workers must be >= 1 (0 only on a Redis deployment.queue, whose remote workers "
                    "then sample everything)"
                )
        if sampling.init_same_noise and self.explore.explore:
            raise ValueError(
                "sampling.init_same_noise with explore.explore: explored seeds are ranked on their own initial noise, "
                "which a same-noise group does not sample; set explore.explore false"
            )
        if workers.num_reserved > workers.local_workers:
            raise ValueError("workers.num_reserved cannot exceed workers.local_workers")
        return self


SECTIONS: dict[str, type[Section]] = {
    name: info.annotation
    for name, info in RunConfig.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, Section)
}
"""Section name -> its model, in the tree's order."""
