"""Thin Dagster assets, one per phase of a GRPO iteration (see assets/iteration.py)."""

from assets.iteration import exploration, policy_update, report, rollouts, seed_plan, validation, weight_patch

ITERATION_ASSETS = [weight_patch, rollouts, exploration, policy_update, seed_plan, validation, report]
FINAL_ASSETS = [weight_patch, validation, report]
"""What the final partition (it-{N}) materializes: sync and validate the trained weights."""
