"""MiniGenEval: prompts, renderer, detector, rewards and held-out evaluation."""
