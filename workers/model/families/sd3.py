"""Stable Diffusion 3 / 3.5 (StableDiffusion3Pipeline): CLIP-L + CLIP-G + T5 prompt embeddings and pooled
projections, unpacked 16-channel latents (the transformer patchifies), standard CFG, a static sigma shift."""

from __future__ import annotations

import torch

from workers.model.families.family import Family, Geometry, read_config


class StableDiffusion3(Family):
    name = "sd3"
    pipeline_class = "StableDiffusion3Pipeline"
    transformer_class = "SD3Transformer2DModel"
    text_encoder_names = ("text_encoder", "text_encoder_2", "text_encoder_3")
    # flow_grpo's SD3.5 LoRA targets: both streams' attention projections.
    lora_targets = (
        "attn.add_k_proj",
        "attn.add_q_proj",
        "attn.add_v_proj",
        "attn.to_add_out",
        "attn.to_k",
        "attn.to_out.0",
        "attn.to_q",
        "attn.to_v",
    )
    packed = False
    pipeline_passes_sigmas = False  # StableDiffusion3Pipeline calls set_timesteps(num_inference_steps)
    negative_prompt = ""  # the pipeline's default (`negative_prompt or ""`), as in flow_grpo's SD3 trainer
    embedding_names = ("prompt_embeds", "pooled")

    def vae_scale_factor(self, spec) -> int:
        return 2 ** (len(read_config(spec.path, "vae")["block_out_channels"]) - 1)

    def encode(self, pipe, prompts, spec, device):
        embeds, _, pooled, _ = pipe.encode_prompt(
            prompt=prompts,
            prompt_2=None,
            prompt_3=None,
            device=device,
            do_classifier_free_guidance=False,
            max_sequence_length=min(spec.max_sequence_length, 256),
        )
        return [{"prompt_embeds": e.float(), "pooled": p.float()} for e, p in zip(embeds, pooled, strict=False)]

    def collate(self, items, device):
        return {
            "encoder_hidden_states": torch.stack([i["prompt_embeds"] for i in items]).to(device),
            "pooled_projections": torch.stack([i["pooled"] for i in items]).to(device),
        }

    def forward(self, transformer, x, sigma_N, cond, geometry: Geometry, spec):
        return transformer(
            hidden_states=x,
            timestep=(sigma_N * 1000).to(x.dtype),  # SD3's transformer takes the scheduler's 0..1000 timesteps
            encoder_hidden_states=cond["encoder_hidden_states"].to(x.dtype),
            pooled_projections=cond["pooled_projections"].to(x.dtype),
            return_dict=False,
        )[0]

    def decode(self, vae, latents, geometry):
        cfg = vae.config
        return vae.decode(latents / cfg.scaling_factor + cfg.shift_factor, return_dict=False)[0]
