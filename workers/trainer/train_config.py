"""The run's training settings (`TrainConfig`): batch shape, sampler, GRPO/NFT recipe, reward and prompts, checked
before any compute.

Example:
    config = TrainConfig(prompts_per_iteration=8, group_size=8, rollout_batch=8, micro_batch=8)
    check_reward_chosen(config, "qwen_image_lora")      # ValueError when no reward is named
"""

from __future__ import annotations

from dataclasses import dataclass, field

from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.task.prompt_file import PromptSource
from workers.task.prompts import CATEGORIES
from workers.task.rewards import get_reward
from workers.trainer.advantages import check_advantage

NO_REWARD = ""
"""A preset's reward when it names none (the GPU presets): a run must choose one (`check_reward_chosen`)."""


def check_reward_chosen(config: "TrainConfig", preset: str) -> None:
    """ValueError, before any compute, when neither the preset nor the run names a reward."""
    if config.reward == NO_REWARD:
        raise ValueError(
            f"preset {preset!r} names no reward: pass --reward SPEC, e.g. "
            "clip:/models/PickScore_v1,processor=/models/CLIP-ViT-H-14 (PickScore), "
            "http://HOST:8200 (a spotlight reward-serve server) or multi:... (docs/MODELS.md, Rewards)"
        )


@dataclass(frozen=True)
class TrainConfig:
    iterations: int = 40
    prompts_per_iteration: int = 8
    group_size: int = 8
    """Samples per prompt (GRPO's group) in the update; >= 2, or advantages are all zero."""
    rollouts_per_prompt: int | None = None
    """Samples drawn per prompt; when more than group_size, the update keeps the group_size of
    largest reward variance (max-variance down-sampling: the k lowest plus the group_size - k
    highest rewards). Drawing an image costs a fraction of scoring it in the update, so a wider
    draw buys contrast cheaply. None = group_size (keep every sample)."""
    reward: str = "minigeneval"
    """Reward spec (workers/task/rewards.py); "" (NO_REWARD) = none chosen: the GPU presets leave it to the run."""
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    seed: int = 0
    """Fixes the prompt schedule and every request's seed."""
    validate_every: int = 5
    """Held-out validation every this many iterations (and before the first, after the last)."""
    validation_seeds: int = 2
    """Fixed seeds per held-out prompt."""
    train_categories: tuple[str, ...] | None = None
    """Train only on prompts of these categories (e.g. the held-out split's); None = all."""
    prompts: PromptSource | None = None
    """The user's training prompts (`--prompts FILE`, workers/task/prompt_file.py); None = MiniGenEval's grammar."""
    seeds_per_request: int = 1
    """Queue workers: samples of one prompt per rollout request, sampled as one batch (a prompt's seeds are
    cut into requests of this many, in order). 1 = one request per sample. What is sampled is the same;
    batching pays where a forward of one sample leaves the device idle (docs/QUEUE.md)."""
    rollout_batch: int | None = None
    """Samples sampled and VAE-decoded together when this process samples (the in-process rollout, exploration
    and validation): the iteration is walked in chunks of this many, so peak memory follows the chunk, not the
    iteration. None = the whole iteration in one batch. Chunks change results only by the kernels' rounding."""
    micro_batch: int | None = None
    """Samples per forward and backward in the update: each optimizer minibatch is split into micro-batches whose
    gradients accumulate (each weighted by its share), so the step equals the whole minibatch's up to float
    rounding while activations are held for one micro-batch only. None = the whole minibatch at once."""

    def __post_init__(self):
        for name in ("rollout_batch", "micro_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (samples per chunk) or None (no chunking), got {value}")
        if not 1 <= self.seeds_per_request <= 256:
            raise ValueError(f"seeds_per_request must be in [1, 256], got {self.seeds_per_request}")
        if self.iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {self.iterations}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (GRPO compares samples of one prompt), got {self.group_size}")
        if self.rollouts_per_prompt is not None and self.rollouts_per_prompt < self.group_size:
            raise ValueError(
                f"rollouts_per_prompt={self.rollouts_per_prompt} must be >= group_size={self.group_size} "
                "(it is how many samples are drawn per prompt before the update keeps group_size)"
            )
        if self.prompts_per_iteration < 1:
            raise ValueError(f"prompts_per_iteration must be >= 1, got {self.prompts_per_iteration}")
        if self.grpo.num_minibatches > self.prompts_per_iteration * self.group_size:
            raise ValueError(f"grpo.num_minibatches={self.grpo.num_minibatches} exceeds the samples per iteration")
        if self.grpo.objective == "flow_grpo" and not self.sampler.sde_steps:
            raise ValueError(
                "sampler.noise_level must be > 0 for objective 'flow_grpo': the ODE has no "
                "log-probs (use grpo.objective='nft' to train on ODE rollouts)"
            )
        if self.validate_every < 1 or self.validation_seeds < 1:
            raise ValueError("validate_every and validation_seeds must be >= 1")
        if self.reward != NO_REWARD:
            get_reward(self.reward)  # an unknown reward fails here, before any compute
            check_advantage(self.grpo, self.reward)
        if self.prompts is not None and self.train_categories is not None:
            raise ValueError(
                "train_categories picks MiniGenEval categories; with a prompts file (prompts) leave it None"
            )
        if self.train_categories is not None:
            unknown = set(self.train_categories) - set(CATEGORIES)
            if unknown or not self.train_categories:
                raise ValueError(
                    f"train_categories must be a non-empty subset of {CATEGORIES}, got {self.train_categories}"
                )
