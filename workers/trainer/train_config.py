"""The run's training settings (`TrainConfig`): batch shape, sampler, GRPO/NFT recipe, reward and prompts, checked
before any compute.

Example:
    config = TrainConfig(prompts_per_iteration=8, group_size=8, rollout_batch=8, micro_batch=8)
    check_reward_chosen(config, "qwen_image_lora")      # ValueError when no reward is named
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from workers.algo.ema import EMAConfig
from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.algo.sde_window import check_sde_window_placement, place_sde_window
from workers.algo.seeds import domain_seed
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

    sde_window_size: int | None = None
    """Steps of an SDE window placed at random each iteration (flow_grpo's sample.sde_window_size; None: the
    sampler's own window, fixed). The sampler's sde_window must then be None."""
    sde_window_range: tuple[int, int] | None = None
    """Steps [low, high) the random window stays in (flow_grpo's sample.sde_window_range); None = every step."""
    init_same_noise: bool = False
    """Every sample of a prompt's group starts from one initial noise (flow_grpo's sample.same_latent, DanceGRPO's
    --init_same_noise), drawn from `group_init_seed`; the SDE steps' noise stays each sample's own."""
    ema: EMAConfig | None = None
    """An exponential moving average of the trained parameters (flow_grpo's train.ema); None = off."""

    eval_guidance: float | None = None
    """A diffusers pipeline's guidance while validating (flow_grpo's sample.eval_guidance_scale); None = the
    model's own (ModelSpec.guidance)."""
    validation_steps: int | None = None
    """Denoising steps of validation's ODE sampler (flow_grpo's sample.eval_num_steps); None = sampler.num_steps."""

    def sampler_at(self, iteration: int) -> SamplerConfig:
        """The sampler iteration `iteration` samples and trains with: the SDE window placed for it when it is random
        (`place_sde_window`, a function of the run seed and the iteration), else `sampler` itself."""
        if self.sde_window_size is None:
            return self.sampler
        window = place_sde_window(self.sde_window_size, self._window_range, self.seed, iteration)
        return dataclasses.replace(self.sampler, sde_window=window)

    def group_init_seed(self, iteration: int, prompt_index: int) -> int | None:
        """The seed of the initial noise group `prompt_index` of `iteration` shares (None without init_same_noise)."""
        return domain_seed(self.seed, "init_noise", iteration, prompt_index) if self.init_same_noise else None

    def init_seeds(self, iteration: int, groups: list[list[int]]) -> list[int] | None:
        """Each sample's initial-noise seed, group by group (the seeds of prompt i in groups[i]): its group's with
        init_same_noise, else None (each sample's own seed)."""
        if not self.init_same_noise:
            return None
        return [domain_seed(self.seed, "init_noise", iteration, i) for i, group in enumerate(groups) for _ in group]

    @property
    def _window_range(self) -> tuple[int, int]:
        return self.sde_window_range or (0, self.sampler.num_steps)

    def __post_init__(self):
        if self.sde_window_size is not None:
            if self.sampler.sde_window is not None:
                raise ValueError("sde_window_size (a window placed at random) and sampler.sde_window (fixed): set one")
            check_sde_window_placement(self.sde_window_size, self._window_range, self.sampler.num_steps)
        elif self.sde_window_range is not None:
            raise ValueError("sde_window_range applies with sde_window_size: set both")
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
