"""The update's advantages as the run's config asks: of the total reward, or per component of a multi-reward.

`GRPOConfig.advantage` "total" normalises the reward within each group (`group_advantages`); "per-component"
normalises each component of a `multi:` reward within its group before weighting (`component_advantages`), from
the raw component values every rollout carries (`Rollouts.reward_components`, the store's `reward_components`).
"""

from __future__ import annotations

import numpy as np
import torch

from workers.algo.advantages import component_advantages
from workers.algo.grpo import GRPOConfig
from workers.task.rewards import get_reward
from workers.task.rewards_multi import MultiReward


def batch_advantages(
    grpo: GRPOConfig,
    reward: str,
    rewards_N: torch.Tensor,
    group_ids_N: torch.Tensor,
    components: dict[str, np.ndarray] | None = None,
    index: torch.Tensor | None = None,
) -> torch.Tensor:
    """(N,) advantages of a batch trained with `grpo` on `reward` (its spec). components: each component's raw
    values over the samples drawn, of which `index` picks the batch's N (None: they are the batch's)."""
    if grpo.advantage == "total":
        return grpo.advantages(rewards_N, group_ids_N)
    if not components:
        raise ValueError(f"advantage 'per-component' needs the reward's components, but reward {reward!r} gave none")
    picked = {name: torch.as_tensor(np.asarray(v))[index] if index is not None else v for name, v in components.items()}
    weights = component_weights(reward)
    return component_advantages(picked, weights, group_ids_N, clip=grpo.adv_clip, norm=grpo.adv_norm)


def component_weights(reward: str) -> dict[str, float]:
    """A `multi:` reward's weight per component name; ValueError for any other reward."""
    fn = get_reward(reward)
    if not isinstance(fn, MultiReward):
        raise ValueError(
            f"advantage 'per-component' needs a multi: reward (e.g. multi:minigeneval=1.0,jpeg_compressibility=0.1),"
            f" got {reward!r}: a single reward has one component, use advantage 'total'"
        )
    return {name: weight for name, _, weight in fn.config.components}


def check_advantage(grpo: GRPOConfig, reward: str) -> None:
    """ValueError, before any compute, when per-component advantages are asked of a reward without components."""
    if grpo.advantage == "per-component":
        component_weights(reward)
