"""Qwen-Image (QwenImagePipeline): Qwen2.5-VL prompt embeddings, 2x2-packed latents of the Wan-style VAE,
true CFG with the pipeline's norm rescale, and the dynamic (resolution-dependent) sigma shift."""

from __future__ import annotations

import torch

from workers.model.families.family import Family, Geometry, pad_stack, read_config, unpack_2x2
from workers.model.families.model_spec import ModelSpec


class QwenImage(Family):
    name = "qwen-image"
    pipeline_class = "QwenImagePipeline"
    transformer_class = "QwenImageTransformer2DModel"
    # Attention projections of both streams and the MLPs (as DiffSynth-Studio's and flow_grpo's Qwen-Image LoRAs).
    lora_targets = (
        "to_q",
        "to_k",
        "to_v",
        "to_out.0",
        "add_q_proj",
        "add_k_proj",
        "add_v_proj",
        "to_add_out",
        "img_mlp.net.0.proj",
        "img_mlp.net.2",
        "txt_mlp.net.0.proj",
        "txt_mlp.net.2",
    )
    negative_prompt = " "  # QwenImagePipeline runs true CFG only with a negative prompt; its examples pass " "

    def vae_scale_factor(self, spec: ModelSpec) -> int:
        return 2 ** len(read_config(spec.path, "vae")["temperal_downsample"])

    def latent_channels(self, spec: ModelSpec) -> int:
        return int(read_config(spec.path, "vae")["z_dim"])

    def encode(self, pipe, prompts, spec, device):
        embeds, mask = pipe._get_qwen_prompt_embeds(prompts, device)  # the pipeline's own template and drop index
        mask = torch.ones(embeds.shape[:2], dtype=torch.bool) if mask is None else mask.bool()
        rows = []
        for e, m in zip(embeds, mask, strict=False):
            kept = e[m.to(e.device)][: spec.max_sequence_length]
            rows.append({"prompt_embeds": kept.float()})
        return rows

    def collate(self, items, device):
        embeds, mask = pad_stack([i["prompt_embeds"] for i in items], device)
        return {"encoder_hidden_states": embeds, "encoder_hidden_states_mask": mask}

    def forward(self, transformer, x, sigma_N, cond, geometry: Geometry, spec):
        n = x.shape[0]
        return transformer(
            hidden_states=x,
            timestep=sigma_N.to(x.dtype),  # the pipeline passes t / 1000 = sigma
            encoder_hidden_states=cond["encoder_hidden_states"].to(x.dtype),
            encoder_hidden_states_mask=cond["encoder_hidden_states_mask"],
            img_shapes=[[(1, geometry.latent_h // 2, geometry.latent_w // 2)]] * n,
            return_dict=False,
        )[0]

    def combine_cfg(self, v_cond, v_uncond, scale):
        """QwenImagePipeline's true CFG: the guided velocity rescaled to the conditional one's norm per token."""
        combined = v_uncond + scale * (v_cond - v_uncond)
        return combined * (torch.norm(v_cond, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True))

    def decode(self, vae, latents, geometry):
        x = unpack_2x2(latents, geometry.latent_h, geometry.latent_w)[:, :, None]  # (N, C, 1, h, w): one frame
        cfg = vae.config
        mean = torch.tensor(cfg.latents_mean, device=x.device, dtype=x.dtype).view(1, cfg.z_dim, 1, 1, 1)
        std = torch.tensor(cfg.latents_std, device=x.device, dtype=x.dtype).view(1, cfg.z_dim, 1, 1, 1)
        return vae.decode(x * std + mean, return_dict=False)[0][:, :, 0]
