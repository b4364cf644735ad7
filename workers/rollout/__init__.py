"""The rollout worker process (`python -m workers.rollout`): requests, in-flight state, weights, preemption notices."""
