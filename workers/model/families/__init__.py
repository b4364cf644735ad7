"""Diffusers pipelines (Qwen-Image, SD3/3.5, FLUX.1) from a local folder as spotlight policies."""
