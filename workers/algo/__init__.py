"""Pure tensor maths: SDE steps, the sampler, GRPO and NFT objectives, seeds, selection, the bandit, rank agreement."""
