"""FLUX.1 (FluxPipeline): CLIP-L pooled + T5 prompt embeddings, 2x2-packed latents with positional ids, the
guidance embedding of FLUX.1-dev (no second pass), and the dynamic sigma shift."""

from __future__ import annotations

import torch

from workers.model.families.family import Family, Geometry, read_config, unpack_2x2


class Flux(Family):
    name = "flux"
    pipeline_class = "FluxPipeline"
    transformer_class = "FluxTransformer2DModel"
    text_encoder_names = ("text_encoder", "text_encoder_2")
    lora_targets = (
        "attn.to_k",
        "attn.to_q",
        "attn.to_v",
        "attn.to_out.0",
        "attn.add_k_proj",
        "attn.add_q_proj",
        "attn.add_v_proj",
        "attn.to_add_out",
        "ff.net.0.proj",
        "ff.net.2",
        "ff_context.net.0.proj",
        "ff_context.net.2",
    )
    uses_true_cfg = False
    embedding_names = ("prompt_embeds", "pooled")

    def vae_scale_factor(self, spec) -> int:
        return 2 ** (len(read_config(spec.path, "vae")["block_out_channels"]) - 1)

    def encode(self, pipe, prompts, spec, device):
        embeds, pooled, _ = pipe.encode_prompt(
            prompt=prompts, prompt_2=None, device=device, max_sequence_length=spec.max_sequence_length
        )
        return [{"prompt_embeds": e.float(), "pooled": p.float()} for e, p in zip(embeds, pooled, strict=False)]

    def collate(self, items, device):
        return {
            "encoder_hidden_states": torch.stack([i["prompt_embeds"] for i in items]).to(device),
            "pooled_projections": torch.stack([i["pooled"] for i in items]).to(device),
        }

    def forward(self, transformer, x, sigma_N, cond, geometry: Geometry, spec):
        n, h, w = x.shape[0], geometry.latent_h // 2, geometry.latent_w // 2
        img_ids = torch.zeros(h, w, 3, device=x.device)
        img_ids[..., 1] += torch.arange(h, device=x.device)[:, None]
        img_ids[..., 2] += torch.arange(w, device=x.device)[None, :]
        text = cond["encoder_hidden_states"]
        guidance = None
        if transformer.config.guidance_embeds:  # FLUX.1-dev: guidance distilled into an embedding
            guidance = torch.full((n,), spec.guidance, device=x.device, dtype=torch.float32)
        return transformer(
            hidden_states=x,
            timestep=sigma_N.to(x.dtype),
            guidance=guidance,
            pooled_projections=cond["pooled_projections"].to(x.dtype),
            encoder_hidden_states=text.to(x.dtype),
            txt_ids=torch.zeros(text.shape[1], 3, device=x.device),
            img_ids=img_ids.reshape(h * w, 3),
            return_dict=False,
        )[0]

    def decode(self, vae, latents, geometry):
        cfg = vae.config
        x = unpack_2x2(latents, geometry.latent_h, geometry.latent_w)
        return vae.decode(x / cfg.scaling_factor + cfg.shift_factor, return_dict=False)[0]
