"""Reward functions and their registry: a reward spec string -> callable on a batch of images and prompts.

A reward takes uint8 images (N, H, W, 3) and their prompts and returns N floats. Configs name
a reward by a spec string, resolved once per process by `get_reward`; an unknown or malformed
spec fails when the config is built, before any compute. A spec is either

- a registered name: `minigeneval`, `minigeneval_strict`, `jpeg_compressibility`, `ocr` (flow_grpo's text-rendering
  score read by PP-OCR: workers/task/rewards_ocr.py), or one a user added with `register_reward("name", fn)`;
- `kind:ARG` for a parametrised kind (`register_reward_kind`):
  - `clip:/models/PickScore_v1` (or `pickscore:`): logit_scale * cos(text, image) of a CLIP model
    in a local folder (workers/task/rewards_clip.py);
  - `remote:http://host:port` or just `http://host:port`: a `spotlight reward-serve` server
    (workers/task/rewards_remote.py);
  - `multi:minigeneval=1.0,jpeg_compressibility=0.1`: a weighted sum that reports each component
    (workers/task/rewards_multi.py);
  - `ocr:threads=4`: the OCR reward with its onnxruntime thread count (`ocr` runs one).

A reward that declares a `fields` keyword (`fn(images, prompts, fields=None)`) also gets one dict per image: the
prompt's other fields from a JSON Lines or Parquet prompts file (`--prompts`), e.g. a reference text for OCR.

A reward may also have `components(images, prompts) -> dict[str, np.ndarray]` and
`combine(components) -> np.ndarray` (a multi-reward does); `score_with_components` returns both
the total and the components, and the trainer reports each component's mean as `reward/<name>`.

Example:
    reward_fn = get_reward("multi:minigeneval=1.0,jpeg_compressibility=0.1")
    rewards, parts = score_with_components(reward_fn, images_NHW3, prompts)  # (N,), {name: (N,)}
"""

from __future__ import annotations

import io
from typing import Callable

import numpy as np
from PIL import Image

from workers.task import rewards_clip, rewards_multi, rewards_ocr, rewards_remote
from workers.task.detector import score_images
from workers.task.reward_inputs import call_reward

RewardFn = Callable[[np.ndarray, list[str]], np.ndarray]
RewardFactory = Callable[[str], RewardFn]
"""Builds a reward from the ARG of a `kind:ARG` spec; raises ValueError on a bad ARG, loads nothing heavy."""
_REGISTRY: dict[str, RewardFn] = {}
_KINDS: dict[str, RewardFactory] = {}
_BUILT: dict[str, RewardFn] = {}
"""Parametrised rewards already built in this process, by spec: each model loads once."""


def register_reward(name: str, fn: RewardFn) -> None:
    """Add a reward under `name` (replacing one of the same name)."""
    if not name or not name.replace("_", "").isalnum():
        raise ValueError(f"reward name {name!r}: use letters, digits and underscores")
    _REGISTRY[name] = fn
    _BUILT.clear()  # a multi-reward built earlier may hold the replaced function


def register_reward_kind(kind: str, factory: RewardFactory) -> None:
    """Add a parametrised reward kind: `get_reward("kind:ARG")` returns `factory(ARG)`."""
    if not kind or not kind.isalnum() or kind in ("http", "https"):
        raise ValueError(f"reward kind {kind!r}: use letters and digits (http and https are URLs)")
    _KINDS[kind] = factory
    _BUILT.clear()


def _unknown(spec: str) -> ValueError:
    return ValueError(
        f"unknown reward {spec!r}; registered rewards: {sorted(_REGISTRY)}; or a spec KIND:ARG "
        f"with KIND one of {sorted(_KINDS)} (e.g. clip:/models/PickScore_v1, "
        "multi:minigeneval=1.0,jpeg_compressibility=0.1), or an http://host:port reward server"
    )


def get_reward(spec: str) -> RewardFn:
    """The reward a spec names (see the module docstring); ValueError naming the registered kinds if none."""
    if not isinstance(spec, str):
        raise ValueError(f"a reward spec is a string, got {type(spec).__name__}")
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    if spec in _BUILT:
        return _BUILT[spec]
    kind, sep, arg = spec.partition(":")
    if kind in ("http", "https"):
        kind, arg = "remote", spec
    if not sep or kind not in _KINDS:
        raise _unknown(spec)
    if not arg.strip():
        raise ValueError(f"reward {spec!r}: {kind}: needs an argument after the colon")
    _BUILT[spec] = _KINDS[kind](arg)
    return _BUILT[spec]


def reward_names() -> list[str]:
    """The registered names (parametrised specs are not listed: see `reward_kinds`)."""
    return sorted(_REGISTRY)


def reward_kinds() -> list[str]:
    return sorted(_KINDS)


def score_with_components(
    reward_fn: RewardFn, images_NHW3: np.ndarray, prompts: list[str], fields: list[dict] | None = None
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The (N,) total and, for a reward with components, each component's (N,) raw values ({} otherwise).
    `fields`: each image's prompt fields (a prompts file's other columns), for rewards that take a `fields` keyword."""
    if hasattr(reward_fn, "components"):
        parts = call_reward(reward_fn.components, images_NHW3, prompts, fields)
        total = reward_fn.combine(parts)
    else:
        parts, total = {}, call_reward(reward_fn, images_NHW3, prompts, fields)
    total = np.asarray(total, dtype=np.float64)
    if total.shape != (len(images_NHW3),):
        raise ValueError(
            f"the reward returned shape {total.shape} for {len(images_NHW3)} images; expected one float each"
        )
    return total, parts


def check_per_request_reward(spec: str, where: str) -> None:
    """ValueError, saying what to use instead, when the reward `spec` names cannot score one request's images on
    their own: a z-scored multi-reward, whose totals depend on which images are scored together. `where` says who
    scores (e.g. "a rollout worker")."""
    if getattr(get_reward(spec), "batch_dependent", False):
        raise ValueError(
            f"reward {spec!r} uses normalize=zscore: it z-scores each component over the images scored together, "
            f"and {where} scores one request's samples (one prompt's group, or a single image), not the iteration's "
            "batch, so each total would depend on how the requests were cut. Use normalize=none with queue workers, "
            "or sample in-process (spotlight train, spotlight run --rollouts inprocess), where the trainer scores "
            "the whole iteration at once"
        )


def minigeneval_partial(images_NHW3: np.ndarray, prompts: list[str]) -> np.ndarray:
    """Share of the prompt's criteria the image satisfies (dense: the default training reward)."""
    return np.array([s.partial for s in score_images(images_NHW3, prompts)], dtype=np.float64)


def minigeneval_strict(images_NHW3: np.ndarray, prompts: list[str]) -> np.ndarray:
    """1 when every criterion passes, else 0 (GenEval's per-image correctness)."""
    return np.array([s.strict for s in score_images(images_NHW3, prompts)], dtype=np.float64)


def jpeg_compressibility(images_NHW3: np.ndarray, prompts: list[str]) -> np.ndarray:
    """DDPO's compressibility reward: minus the JPEG size (quality 95) in kilobytes."""
    sizes = []
    for img in images_NHW3:
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=95)
        sizes.append(buf.tell() / 1000.0)
    return -np.array(sizes, dtype=np.float64)


register_reward("minigeneval", minigeneval_partial)
register_reward("minigeneval_strict", minigeneval_strict)
register_reward("jpeg_compressibility", jpeg_compressibility)
register_reward("ocr", rewards_ocr.OcrReward())  # one thread: beside the trainer or a worker on the other cores
register_reward_kind("clip", rewards_clip.clip_reward)
register_reward_kind("pickscore", rewards_clip.clip_reward)  # PickScore is a fine-tuned CLIP-H: the same score
register_reward_kind("remote", rewards_remote.remote_reward)
register_reward_kind("ocr", rewards_ocr.ocr_reward)
register_reward_kind("multi", lambda arg: rewards_multi.multi_reward(arg, get_reward))
