"""What the validate phase scores: which reward, on which held-out prompts, with fixed seeds.

The pixel MiniGenEval policy is scored as it always was: MiniGenEval's detector (the strict
GenEval score, with per-criterion and per-category breakdowns, `minigeneval_strict`) on
MiniGenEval's held-out split. A run on a diffusers pipeline (`--model`) is scored by default
with the run's own reward, averaged over the held-out prompts x fixed seeds: a PickScore run
reports its held-out PickScore. Either may name another reward (`--validation-reward`) or its
own prompts (`--validation-prompts FILE`, one prompt a line). A z-scored multi-reward cannot
validate (its totals average to 0 over whatever is scored), and the pixel policy (or the
detector) only reads MiniGenEval prompts; both are refused before any compute. The pixel policy of
MiniOCR (workers/task/miniocr.py) is the exception: on MiniOCR prompts (its prompts file's held-out
strings) it is scored with the run's reward, the OCR reward, as a diffusers pipeline would be.

Example:
    config = ValidationConfig(reward="clip:/models/PickScore_v1", prompts=read_prompts_file("heldout.txt"))
    plan = resolve_validation(config, train_reward="clip:/models/PickScore_v1", model=True)
    result = plan.evaluate(policy, seeds_per_prompt=2, sampler=train.sampler)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from workers.task.miniocr import is_ocr_prompt
from workers.task.prompts import parse_prompt, split_prompts
from workers.task.rewards import get_reward

if TYPE_CHECKING:
    from workers.task.prompt_file import PromptSource

DETECTOR_REWARD = "minigeneval_strict"
"""The reward whose mean is MiniGenEval's detector score: validating with it keeps the detector's breakdowns."""
MAX_PROMPTS = 100_000


@dataclass(frozen=True)
class ValidationConfig:
    """A run's choice of validation reward and held-out prompts (None: the defaults above)."""

    reward: str | None = None
    """Reward spec that scores the held-out images; None = the detector for the pixel policy, the run's reward
    for a diffusers pipeline."""
    prompts: tuple[str, ...] | None = None
    """Held-out prompts; None = MiniGenEval's held-out split."""
    fields: "PromptSource | None" = None
    """The prompts file the held-out prompts came from (its held-out split), whose other fields reach the reward."""

    def __post_init__(self) -> None:
        if self.reward is not None:
            check_validation_reward(self.reward)
        if self.prompts is not None:
            check_prompts(self.prompts, "validation prompts")


@dataclass(frozen=True)
class ValidationPlan:
    """What one validate phase does: `reward` scores `prompts` x fixed seeds."""

    reward: str
    prompts: tuple[str, ...]
    detector: bool
    """True: MiniGenEval's detector (GenEval's strict score and its breakdowns), sampled as it always was;
    False: the mean of `reward`, sampled with the run's sampler as an ODE."""
    fields: "PromptSource | None" = None
    """Where each held-out prompt's fields come from (a prompts file), or None."""

    def evaluate(
        self, policy, seeds_per_prompt: int, sampler, keep_images: bool = False, batch_size: int | None = None
    ):
        """Score `policy` on the plan's prompts x `seeds_per_prompt` fixed seeds (workers/task/evaluate.py), sampled
        and decoded `batch_size` images at a time (None: evaluate's and evaluate_reward's own defaults)."""
        from workers.task.evaluate import evaluate, evaluate_reward  # lazy: evaluate pulls torch

        sized = {} if batch_size is None else {"batch_size": batch_size}
        if self.detector:
            return evaluate(policy, list(self.prompts), seeds_per_prompt, keep_images=keep_images, **sized)
        return evaluate_reward(
            policy,
            list(self.prompts),
            self.reward,
            seeds_per_prompt,
            sampler,
            keep_images=keep_images,
            fields=self.fields,
            **sized,
        )


def resolve_validation(config: ValidationConfig | None, train_reward: str, model: bool) -> ValidationPlan:
    """The reward and prompts a run validates with; ValueError, saying what to pass, when they cannot go together
    (prompts the pixel policy or the detector cannot read; a reward that cannot score one image on its own)."""
    config = config or ValidationConfig()
    prompts = config.prompts or tuple(split_prompts()["heldout"])
    text_task = not model and all(is_ocr_prompt(p) for p in prompts)  # the MiniOCR pixel policy: no detector
    reward = config.reward or (train_reward if model or text_task else DETECTOR_REWARD)
    check_validation_reward(reward, given=config.reward is not None)
    detector = reward == DETECTOR_REWARD
    if text_task and detector:
        raise ValueError(
            "MiniOCR's held-out prompts ask for text, which MiniGenEval's detector does not read: validate with "
            "the ocr reward (the default when the run trains on it)"
        )
    if not model and not text_task:
        check_minigeneval_prompts(
            prompts,
            "the pixel policy reads only those (its text encoder knows MiniGenEval's words); give MiniGenEval prompts",
        )
    elif detector:
        check_minigeneval_prompts(
            prompts,
            "MiniGenEval's detector (validation reward minigeneval_strict) reads only "
            "those; pass a --validation-reward that scores any prompt (e.g. "
            "clip:/models/PickScore_v1)",
        )
    return ValidationPlan(reward, prompts, detector, config.fields)


def validation_from_options(
    reward: str | None,
    prompts_file: str | Path | None,
    train_reward: str,
    model: bool,
    train_prompts: "PromptSource | None" = None,
    max_prompts: int | None = None,
) -> ValidationConfig:
    """The ValidationConfig of `--validation-reward` / `--validation-prompts` (the file read now), checked against
    the run's reward and policy (the defaults too); ValueError saying what to change, before any compute. Without
    --validation-prompts, a training prompts file with a held-out share (`train_prompts`) gives the held-out
    prompts. `max_prompts` keeps that many of them, spread evenly (`spread_evenly`)."""
    prompts, fields = None if prompts_file is None else read_prompts_file(prompts_file), None
    if prompts is None and train_prompts is not None and train_prompts.heldout_fraction > 0:
        prompts, fields = train_prompts.table().heldout, train_prompts
    if max_prompts is not None:
        prompts = spread_evenly(tuple(prompts if prompts is not None else split_prompts()["heldout"]), max_prompts)
    config = ValidationConfig(reward=reward, prompts=prompts, fields=fields)
    resolve_validation(config, train_reward, model)
    return config


def spread_evenly(prompts: tuple[str, ...], count: int) -> tuple[str, ...]:
    """`count` of `prompts` at even spacing, in their order (all of them when there are no more than `count`): a
    list grouped by category, as MiniGenEval's held-out split is (16 prompts each of 4), keeps every category in
    its share."""
    if count < 1:
        raise ValueError(f"validation_max_prompts must be >= 1, got {count}")
    if len(prompts) <= count:
        return prompts
    return tuple(prompts[i * len(prompts) // count] for i in range(count))


def check_validation_reward(spec: str, given: bool = True) -> None:
    """ValueError for an unknown spec, or one whose per-image value depends on what is scored with it."""
    if getattr(get_reward(spec), "batch_dependent", False):
        source = "--validation-reward" if given else "the run's reward (the validation default for --model)"
        raise ValueError(
            f"{source} {spec!r} uses normalize=zscore: z-scored totals average to 0 over the held-out "
            "images whatever the policy does; pass --validation-reward with one reward or a "
            "multi-reward with normalize=none"
        )


def check_prompts(prompts, where: str) -> None:
    """ValueError unless `prompts` is a non-empty tuple of distinct, non-blank strings."""
    if not isinstance(prompts, tuple) or not prompts or len(prompts) > MAX_PROMPTS:
        raise ValueError(f"{where}: give between 1 and {MAX_PROMPTS} prompts")
    for n, prompt in enumerate(prompts, start=1):
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError(f"{where}: prompt {n} is empty or not text ({prompt!r:.60})")
    seen: dict[str, int] = {}
    for n, prompt in enumerate(prompts, start=1):
        if prompt in seen:
            raise ValueError(
                f"{where}: prompt {n} repeats prompt {seen[prompt]} ({prompt!r:.60}); each held-out "
                "prompt counts once (the fixed seeds give it several images)"
            )
        seen[prompt] = n


def check_minigeneval_prompts(prompts, why: str) -> None:
    """ValueError naming the first prompt MiniGenEval's grammar does not read, and `why` that matters."""
    for n, prompt in enumerate(prompts, start=1):
        try:
            parse_prompt(prompt)
        except ValueError as err:
            raise ValueError(
                f"validation prompt {n} ({prompt!r:.60}) is not a MiniGenEval prompt ({err}), and {why}"
            ) from None


def read_prompts_file(path: str | Path) -> tuple[str, ...]:
    """The prompts of a UTF-8 text file, one a line (blank lines and lines starting with # are skipped);
    ValueError naming the file and what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--validation-prompts {path}: no such file; give a text file with one prompt a line")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--validation-prompts {path}: cannot read it as UTF-8 text ({err})") from None
    prompts = tuple(line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))
    if not prompts:
        raise ValueError(f"--validation-prompts {path}: holds no prompt (one a line; # starts a comment)")
    check_prompts(prompts, f"--validation-prompts {path}")
    return prompts
