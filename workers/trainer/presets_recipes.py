"""Published recipes as presets: flow_grpo's SD3.5-M GenEval / OCR / PickScore, Qwen-Image PickScore and FLUX.1
PickScore configs, and DanceGRPO's FLUX.1 script, each field set to the cited value.

Sources (read for these presets):
- flow_grpo: config/grpo.py (`geneval_sd3`, `general_ocr_sd3`, `pickscore_sd3`, `pickscore_qwenimage`,
  `pickscore_flux`) over config/base.py's defaults, and scripts/train_sd3.py (LoRA r=32, alpha 64; EMA decay 0.9
  every 8 steps; `num_train_timesteps = int(num_steps * timestep_fraction)`), yifan123/flow_grpo at commit 54809b5.
- DanceGRPO: scripts/finetune/finetune_flux_grpo.sh and fastvideo/train_grpo_flux.py, XueZeyue/DanceGRPO at 22b85ef.

The batch shape is the recipe's per iteration (an "epoch" there): flow_grpo samples num_batches_per_epoch x
train_batch_size x 32 GPUs images, num_image_per_prompt per prompt, and steps the optimizer twice per epoch
(gradient_accumulation_steps = num_batches_per_epoch / 2). What cannot be reproduced here, and why, is in each
docstring and in docs/MODELS.md ("Recipe presets"); tests/workers/trainer/test_recipe_presets.py holds the cited
values and fails when a preset drifts from them.

Example:
    config = sd35m_geneval()                    # a RunConfig; a run adds --model DIR --prompts FILE --reward SPEC
"""

from __future__ import annotations

from resources.settings.config import RunConfig
from resources.settings.resolve import derive

GPU_ROLLOUT_BATCH = 8
"""The GPU presets sample and VAE-decode 8 requests at a time: a 512-px Qwen-Image decode holds about 1.7 GB of
activations per image in BF16 (docs/MODELS.md, "Memory"); the whole iteration would not fit."""
GPU_MICRO_BATCH = 8
"""The GPU presets' samples per forward and backward (both CFG passes carry gradients): a minibatch in accumulated
micro-batches of 8, the same step."""
GPU_MEMORY = dict(rollout_batch=GPU_ROLLOUT_BATCH)
"""Sampling settings that shape memory, not the recipe."""


def sd35m_geneval() -> RunConfig:
    """flow_grpo `geneval_sd3`: SD3.5-M, 512 px, 10 SDE steps at noise level 0.7 (9 trained), CFG 4.5, 48 prompts x
    24 images an iteration in 2 optimizer steps, KL beta 0.04, global-std advantages, EMA, validation at 40 steps.
    GenEval's reward (flow_grpo's detector server) is not shipped: pass --reward http://HOST:PORT (a reward-serve)."""
    return RunConfig(
        preset="sd35m_geneval",
        # train_sd3.py: LoraConfig(r=32, lora_alpha=64); config.resolution 512; sample.guidance_scale 4.5
        model=dict(resolution=512, lora_rank=32, lora_alpha=64.0, guidance=4.5, base_dtype="bf16"),
        train=dict(
            iterations=300,
            seed=42,  # base.py: config.seed
            prompts_per_iteration=48,  # 4 batches x 9 images x 32 GPUs / 24 per prompt
            group_size=24,  # sample.num_image_per_prompt
            reward="",
            objective="flow_grpo",
            lr=3e-4,  # base.py: train.learning_rate
            weight_decay=1e-4,  # base.py: train.adam_weight_decay
            max_grad_norm=1.0,  # base.py: train.max_grad_norm
            clip_range=1e-4,  # base.py: train.clip_range
            adv_clip=5.0,  # base.py: train.adv_clip_max
            adv_norm="global_std",  # sample.global_std = True
            kl_beta=0.04,  # train.beta
            kl_form="flow_grpo",  # the KL term as train_sd3.py computes it, which beta 0.04 was tuned with
            epochs=1,  # train.num_inner_epochs
            minibatches=2,  # gradient_accumulation_steps = num_batches_per_epoch // 2: two steps an epoch
            micro_batch=GPU_MICRO_BATCH,
            gradient_checkpointing=True,
            ema=True,  # train.ema; decay 0.9 every 8 steps in train_sd3.py
            ema_decay=0.9,
            ema_every=8,
        ),
        # sample.num_steps 10, noise_level 0.7 (base.py); timestep_fraction 0.99 trains int(10 x 0.99) = 9 steps
        sampling=dict(num_steps=10, noise_level=0.7, sde_window=(0, 9), forward_dtype="bf16", **GPU_MEMORY),
        # sample.eval_num_steps 40; eval_freq 60
        validation=dict(validate_every=60, validation_seeds=1, validation_steps=40),
    )


def sd35m_ocr() -> RunConfig:
    """flow_grpo `general_ocr_sd3`: `geneval_sd3`'s recipe on the OCR reward (flow_grpo's formula on PP-OCR here:
    workers/task/rewards_ocr.py), KL beta 0.04."""
    return derive(sd35m_geneval(), "sd35m_ocr", train=dict(reward="ocr"))


def sd35m_pickscore() -> RunConfig:
    """flow_grpo `pickscore_sd3`: `geneval_sd3`'s recipe with KL beta 0.01. PickScore's weights are not shipped: pass
    --reward pickscore:/models/PickScore_v1,processor=/models/CLIP-ViT-H-14."""
    return derive(sd35m_geneval(), "sd35m_pickscore", train=dict(kl_beta=0.01))  # train.beta 0.01


def qwen_image_pickscore() -> RunConfig:
    """flow_grpo `pickscore_qwenimage`: Qwen-Image, 512 px, 10 steps with a 2-step SDE window placed at random in
    steps 0-4 at noise level 1.2, true CFG 4 (validation at base.py's eval guidance 4.5, 50 steps), 32 prompts x 16
    images in 2 optimizer steps, no KL, global-std advantages, no EMA. Its LoRA rank is set in its training script,
    not its config: r=64 here is this project's choice, unverified against flow_grpo."""
    return derive(
        sd35m_geneval(),
        "qwen_image_pickscore",
        # sample.guidance_scale 4; sample.eval_guidance_scale 4.5 (base.py, not overridden)
        model=dict(lora_rank=64, lora_alpha=None, guidance=4.0, eval_guidance=4.5),
        train=dict(
            prompts_per_iteration=32,  # 4 batches x 4 images x 32 GPUs / 16 per prompt
            group_size=16,  # sample.num_image_per_prompt
            kl_beta=0.0,  # train.beta 0
            ema=False,  # train.ema False
        ),
        # noise_level 1.2; sde_window_size 2; sde_window_range (0, num_steps // 2); timestep_fraction 1.0 (base.py)
        sampling=dict(noise_level=1.2, sde_window=None, sde_window_size=2, sde_window_range=(0, 5)),
        validation=dict(validate_every=30, validation_steps=50),  # eval_num_steps 50; eval_freq 30
    )


def flux1_flow_grpo() -> RunConfig:
    """flow_grpo `pickscore_flux`: FLUX.1-dev, 512 px, 6 SDE steps at noise level 0.9 (5 trained), guidance
    embedding 3.5 (validation at base.py's eval guidance 4.5, 28 steps), 48 prompts x 24 images in 2 optimizer
    steps, no KL, global-std advantages, EMA. Its LoRA is set in scripts/train_flux.py, not read here: r=32, alpha
    64 are train_sd3.py's, unverified for FLUX."""
    return derive(
        sd35m_geneval(),
        "flux1_flow_grpo",
        # sample.guidance_scale 3.5 (FLUX.1-dev's guidance embedding); eval_guidance_scale 4.5 (base.py)
        model=dict(guidance=3.5, eval_guidance=4.5),
        train=dict(kl_beta=0.0),  # train.beta 0; 3 x 12 batches x 32 GPUs / 24 = 48 prompts, 2 steps an epoch
        # num_steps 6; noise_level 0.9; timestep_fraction 0.99 trains int(6 x 0.99) = 5 steps
        sampling=dict(num_steps=6, noise_level=0.9, sde_window=(0, 5)),
        validation=dict(validate_every=30, validation_steps=28),  # eval_num_steps 28; eval_freq 30
    )


def flux1_dancegrpo() -> RunConfig:
    """DanceGRPO's FLUX.1-dev script (finetune_flux_grpo.sh): full fine-tuning at lr 1e-5, 720 px, 16 steps, 16
    prompts x 12 images (one prompt per GPU on 16 GPUs) in 3 optimizer steps (accumulation 4), one initial noise per
    group, per-group advantages, no KL, no EMA (the script does not pass --use_ema), guidance embedding 3.5
    (hard-coded in train_grpo_flux.py). Not reproduced here: DanceGRPO's SDE step (`flux_step`, std eta·sqrt(dσ)
    with eta 0.3) is not flow_grpo's (noise level 0.3 here is the nearest knob, not the same noise), its shift 3
    (the FLUX family uses its scheduler's own schedule), its random 60 % of the 15 steps trained per sample (all 15
    here), and its unbiased group std + 1e-8 (population std + 1e-4 here). HPSv2 is not shipped: pass --reward."""
    return derive(
        sd35m_geneval(),
        "flux1_dancegrpo",
        model=dict(resolution=720, lora_rank=0, lora_alpha=None, guidance=3.5, base_dtype="fp32"),  # --h/--w 720
        train=dict(
            seed=42,  # --seed 42
            prompts_per_iteration=16,  # --train_batch_size 1 on 2 nodes x 8 GPUs
            group_size=12,  # --num_generations 12
            lr=1e-5,  # --learning_rate 1e-5
            weight_decay=1e-4,  # --weight_decay 0.0001
            max_grad_norm=1.0,  # --max_grad_norm 1.0
            clip_range=1e-4,  # --clip_range 1e-4
            adv_clip=5.0,  # --adv_clip_max 5.0
            adv_norm="group",  # --use_group: each group's own std
            kl_beta=0.0,
            kl_form="step",
            minibatches=3,  # 12 samples a GPU, an optimizer step every --gradient_accumulation_steps 4
            ema=False,
        ),
        # --sampling_steps 16, --eta 0.3, --ignore_last (step 16 is not trained), --init_same_noise
        sampling=dict(num_steps=16, noise_level=0.3, sde_window=(0, 15), init_same_noise=True),
        explore=dict(explore=False),  # init_same_noise: explored seeds would not carry their own initial noise
        validation=dict(validate_every=40, validation_steps=None),  # --checkpointing_steps 40
    )
