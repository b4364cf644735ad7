"""A weighted multi-reward that reports each component, optionally z-scored per batch before weighting.

A plain weighted sum lets the reward with the largest spread set the advantages, and the others
stall (flow_grpo #142: two rewards that each rise alone; summed, the harder one barely moves).
`normalize=zscore` rescales each component to mean 0, std 1 over the scored batch before
weighting, so a weight says how much a component counts whatever its units. The z-score depends
on what is scored together (`batch_dependent`): the trainer scores a whole iteration at once, but a
queue worker scores one request (one prompt's samples, or a single image), so queue workers refuse a
z-scored reward (`workers.task.rewards.check_per_request_reward`), and so does validation, where
z-scored totals average to 0 by construction.

Spec forms (`get_reward`):
    multi:minigeneval=1.0,jpeg_compressibility=0.1                  # SPEC=WEIGHT, comma-separated
    multi:minigeneval=1.0,jpeg_compressibility=0.1,normalize=zscore
    multi:{"weights": {"pick": 1.0, "minigeneval": 0.5}, "rewards": {"pick": "clip:/models/PickScore_v1"},
           "normalize": "zscore"}                                   # JSON: names for specs with commas

Example:
    fn = get_reward("multi:minigeneval=1.0,jpeg_compressibility=0.1")
    parts = fn.components(images_NHW3, prompts)    # {"minigeneval": (N,), "jpeg_compressibility": (N,)}
    total = fn.combine(parts)                      # (N,) = 1.0 * parts[...] + 0.1 * parts[...]
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from workers.task.reward_inputs import call_reward

NORMALIZE = ("none", "zscore")


@dataclass(frozen=True)
class MultiRewardConfig:
    components: tuple[tuple[str, str, float], ...]
    """(name, reward spec, weight) per component; the name labels its stats (`reward/<name>`)."""
    normalize: str = "none"
    """'none': the weighted sum of raw values; 'zscore': each component z-scored over the batch first."""

    def __post_init__(self):
        names = [name for name, _, _ in self.components]
        if not names:
            raise ValueError("multi reward: give at least one component, e.g. multi:minigeneval=1.0")
        if len(set(names)) != len(names):
            raise ValueError(f"multi reward: component names must be unique, got {names}")
        bad = [name for name, _, w in self.components if not math.isfinite(w)]
        if bad:
            raise ValueError(f"multi reward: weights must be finite numbers; bad for {bad}")
        if self.normalize not in NORMALIZE:
            raise ValueError(f"multi reward: normalize must be one of {NORMALIZE}, got {self.normalize!r}")


def _weight(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"multi reward: the weight of {name!r} must be a number, got {value!r}")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"multi reward: the weight of {name!r} must be a number, got {value!r}") from None


def _parse_json(arg: str) -> MultiRewardConfig:
    try:
        spec = json.loads(arg)
    except json.JSONDecodeError as err:
        raise ValueError(f"multi reward: the JSON form does not parse: {err}") from None
    unknown = set(spec) - {"weights", "rewards", "normalize"} if isinstance(spec, dict) else {"(not an object)"}
    if unknown or not isinstance(spec.get("weights"), dict) or not isinstance(spec.get("rewards", {}), dict):
        raise ValueError(
            'multi reward: the JSON form is {"weights": {NAME: WEIGHT}, "rewards": {NAME: SPEC}, '
            f'"normalize": "none" | "zscore"}}; unexpected keys: {sorted(unknown)}'
        )
    specs = spec.get("rewards", {})
    extra = set(specs) - set(spec["weights"])
    if extra:
        raise ValueError(f"multi reward: rewards {sorted(extra)} have no weight")
    components = tuple((name, str(specs.get(name, name)), _weight(name, w)) for name, w in spec["weights"].items())
    return MultiRewardConfig(components, spec.get("normalize", "none"))


def parse_multi_spec(arg: str) -> MultiRewardConfig:
    """The part after `multi:` -> config; ValueError saying which component is malformed."""
    if arg.lstrip().startswith("{"):
        return _parse_json(arg)
    components, normalize = [], "none"
    for item in arg.split(","):
        spec, sep, value = item.strip().rpartition("=")
        if not sep or not spec:
            raise ValueError(
                f"multi reward component {item!r}: write SPEC=WEIGHT, e.g. minigeneval=1.0 "
                "(a spec with commas needs the JSON form)"
            )
        if spec == "normalize":
            normalize = value
        else:
            components.append((spec, spec, _weight(spec, value)))
    return MultiRewardConfig(tuple(components), normalize)


def zscore(values_N: np.ndarray) -> np.ndarray:
    """(x - mean) / std over the batch; all zeros when every value is equal (the component ranks nothing here)."""
    if len(values_N) < 2:
        raise ValueError(
            f"multi reward normalize=zscore needs at least 2 images per call, got {len(values_N)}; "
            "score components per image and combine them over the batch, or use normalize=none"
        )
    std = values_N.std()
    return np.zeros_like(values_N) if std == 0 else (values_N - values_N.mean()) / std


class MultiReward:
    """sum_i weight_i * value_i (or * zscore(value_i)); `components` gives each value_i, `combine` the total."""

    def __init__(self, config: MultiRewardConfig, resolve: Callable[[str], Callable]):
        self.config = config
        self.parts = [(name, resolve(spec), weight) for name, spec, weight in config.components]  # fails now if unknown

    @property
    def batch_dependent(self) -> bool:
        """True when an image's total depends on the other images scored with it (normalize=zscore, here or in
        a component that is itself a multi-reward)."""
        return self.config.normalize == "zscore" or any(
            getattr(fn, "batch_dependent", False) for _, fn, _ in self.parts
        )

    def load(self) -> None:
        """Load every component that loads a model (see ClipReward.load)."""
        for _, fn, _ in self.parts:
            if callable(getattr(fn, "load", None)):
                fn.load()

    def components(
        self, images_NHW3: np.ndarray, prompts: list[str], fields: list[dict] | None = None
    ) -> dict[str, np.ndarray]:
        """Each component's raw (N,) float64 values, by name (`fields` reach the components that take them)."""
        out = {}
        for name, fn, _ in self.parts:
            values = np.asarray(call_reward(fn, images_NHW3, prompts, fields), dtype=np.float64)
            if values.shape != (len(images_NHW3),):
                raise ValueError(
                    f"multi reward component {name!r} returned shape {values.shape} for {len(images_NHW3)} images"
                )
            out[name] = values
        return out

    def combine(self, components: dict[str, np.ndarray]) -> np.ndarray:
        """The weighted total of `components` (any batch of them, e.g. stored per image and gathered)."""
        missing = [name for name, _, _ in self.parts if name not in components]
        if missing:
            raise ValueError(f"multi reward: components {missing} are missing")
        normal = zscore if self.config.normalize == "zscore" else (lambda v: v)
        return sum(w * normal(np.asarray(components[name], dtype=np.float64)) for name, _, w in self.parts)

    def __call__(self, images_NHW3: np.ndarray, prompts: list[str], fields: list[dict] | None = None) -> np.ndarray:
        return self.combine(self.components(images_NHW3, prompts, fields))


def multi_reward(arg: str, resolve: Callable[[str], Callable]) -> MultiReward:
    """The `multi:` spec's factory; `resolve` (rewards.get_reward) builds each component, so unknown ones fail now."""
    return MultiReward(parse_multi_spec(arg), resolve)
