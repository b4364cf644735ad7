"""The non-finite gradient guard: an optimizer step whose gradient holds a NaN or inf is skipped, counted, and bounded.

One bad minibatch (an overflowing log-prob, a reward that went NaN) must not write NaN into
the FP32 masters and AdamW's moments, which no later step could undo; a run of them means
something is broken and the update stops with a message instead of training on garbage.

Example:
    guard = StepGuard(max_consecutive_skips=3)
    if guard.allows(grad_norm, iteration):     # clip_grad_norm_'s total norm is NaN/inf if any grad is
        optimizer.step()
    guard.skipped_steps                        # how many this update skipped
"""

from __future__ import annotations

import math


class NonFiniteGradientError(RuntimeError):
    """Too many optimizer steps in a row had a non-finite gradient."""


class StepGuard:
    """Counts skipped steps; raises NonFiniteGradientError at `max_consecutive_skips` in a row."""

    def __init__(self, max_consecutive_skips: int = 3) -> None:
        if max_consecutive_skips < 1:
            raise ValueError(f"max_consecutive_skips must be >= 1, got {max_consecutive_skips}")
        self.max_consecutive_skips = max_consecutive_skips
        self.skipped_steps = 0
        """Steps skipped since the last `reset` (one update)."""
        self.consecutive = 0
        """Skips since the last step taken."""

    def reset(self) -> None:
        """Start counting one update's skips (the consecutive run carries over)."""
        self.skipped_steps = 0

    def allows(self, grad_norm: float, iteration: int) -> bool:
        """True if the step may be taken; False (counted) for a non-finite gradient norm."""
        if math.isfinite(grad_norm):
            self.consecutive = 0
            return True
        self.skipped_steps += 1
        self.consecutive += 1
        if self.consecutive >= self.max_consecutive_skips:
            raise NonFiniteGradientError(
                f"iteration {iteration}: {self.consecutive} optimizer steps in a row had a non-finite gradient "
                f"(norm {grad_norm}); none of them touched the weights. Check the rewards and advantages for "
                "NaN/inf, or lower grpo.lr"
            )
        return False
