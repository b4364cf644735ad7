"""The checks every request (rollout or exploration) makes of what it names, before any compute."""

from __future__ import annotations


def check_request_fields(run: str, prompt: str, weights_version: int, reward: str) -> None:
    """ValueError naming the field when the run name, a prompt word, the weights version or the reward is unknown."""
    from resources.keys import check_name
    from workers.task.prompts import parse_prompt
    from workers.task.rewards import get_reward

    check_name(run, "run name")
    if isinstance(weights_version, bool) or not isinstance(weights_version, int) or weights_version < 0:
        raise ValueError(f"weights_version must be an int >= 0, got {weights_version!r}")
    parse_prompt(prompt)  # an unknown word fails here, before any compute
    get_reward(reward)
