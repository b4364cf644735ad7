"""The GRPO trainer, its checkpoint format in the store, presets and the in-process loop."""
