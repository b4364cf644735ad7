"""The memory plan: what one trainer rank's GPU holds in each phase of a run, per component, before any weight loads.

Sizes come from the folder's config.json files, the model built on the meta device (workers/trainer/model_sizes.py);
what depends on data (activations, the VAE decode) comes from figures measured on the CPU at the real width
(`CALIBRATION`, from `spotlight bench memory --calibrate`), scaled to the run's tokens, batch, blocks and dtype.
The phases of a rank (workers/coordinator): encoding every prompt of the run at the base version (the text encoders
alone: the transformer is still on the host), sampling (the policy, the VAE and one `rollout_batch` decode, the
reward model) and the update (the policy, what trains with its gradients and AdamW state, activations of one
micro-batch). The peak is the largest phase; a run whose peak exceeds the GPU is refused, naming the knobs.

Activations of one micro-batch, per block, are `saved x tokens x width x element bytes x samples` (both true-CFG
passes carry gradients: twice the samples). With gradient checkpointing only each block's input stays (one hidden
state per token: saved = 1) plus one block's recompute. `saved` is the measured figure of one real-width block
(bytes held for backward / (tokens x width x 4), FP32 on the CPU); on a GPU the forward runs in BF16 (2 bytes). The
CPU's attention keeps its softmax (the GPU's flash attention does not), so at the calibration's short sequences the
figure errs high by a few percent. Unverified on a GPU (no session has had one).

Example:
    plan = plan_memory(config, model_sizes(config.model.model, config.model.lora_rank), gpu_GB=80)
    print(format_plan(plan)); check_fits(plan)          # MemoryPlanError naming the knobs when it cannot fit
"""

from __future__ import annotations

from dataclasses import dataclass, field

from resources.settings.config import RunConfig
from workers.model.families.registry import family_for
from workers.trainer.model_sizes import ModelSizes

GB = 1e9
HEADROOM_GB = 2.0
"""Held back from the GPU's memory: the CUDA context, NCCL's buffers and the caching allocator's fragmentation."""
PROMPT_TOKENS = 256
"""Text tokens per prompt the plan assumes (at most max_sequence_length): a long prompt."""


@dataclass(frozen=True)
class Calibration:
    """Figures measured on one real-width block on the CPU, and where they came from."""

    saved_per_token_width: float
    """Bytes one block holds for backward per token per unit of width, over the element size (FP32: 4 bytes)."""
    inference_per_token_width: float
    """Peak bytes above the weights of one block's forward without gradients (sampling), per token per unit of
    width, over the element size."""
    decode_bytes_per_pixel: float
    """Peak bytes of the VAE decode per output pixel of one image, over the element size."""
    source: str


CALIBRATION = Calibration(
    saved_per_token_width=18.53,
    inference_per_token_width=14.3,
    decode_bytes_per_pixel=2119.9,
    source="spotlight bench memory --calibrate --resolution 256 --threads 1 on Qwen-Image's real width, 1 block, "
    "LoRA r=64, 272 tokens, batch 2; 2-core CPU VM (docs/BENCHMARKS.md)",
)


@dataclass
class MemoryPlan:
    """One rank's predicted GPU memory, by component and by phase."""

    components: dict[str, float]
    """Component -> GB."""
    phases: dict[str, list[str]]
    """Phase -> the components it holds at once."""
    gpu_GB: float | None
    notes: list[str] = field(default_factory=list)
    knobs: list[str] = field(default_factory=list)
    """What to turn when the peak does not fit, largest first."""

    def phase_GB(self, phase: str) -> float:
        return sum(self.components[c] for c in self.phases[phase])

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_GB)

    @property
    def peak_GB(self) -> float:
        return self.phase_GB(self.peak_phase)

    @property
    def fits(self) -> bool:
        return self.gpu_GB is None or self.peak_GB <= self.gpu_GB - HEADROOM_GB


class MemoryPlanError(ValueError):
    """A run whose planned peak exceeds the GPU."""


def plan_memory(
    config: RunConfig, sizes: ModelSizes, gpu_GB: float | None, calibration: Calibration = CALIBRATION
) -> MemoryPlan:
    """The plan of `config` on a pipeline of `sizes`, for a GPU of `gpu_GB` (None: no verdict)."""
    m, t, s = config.model, config.train, config.sampling
    n = t.nproc
    base_bytes = 2 if m.base_dtype == "bf16" else 4
    act_bytes = 4 if s.forward_dtype == "fp32" else 2
    P = sizes.transformer_params
    c: dict[str, float] = {}
    # What trains besides the weights that sample (gradients, AdamW state, full FT's shards and frozen copies) is
    # freed after the update (workers/coordinator/train.py): the "update state" components are in that phase only.
    if m.lora_rank:
        copies = 2 if t.objective == "nft" else 1  # NFT's v_old is a second adapter, kept on the transformer
        c["transformer base (frozen, whole on every rank)"] = P * base_bytes / GB
        c["LoRA adapters (FP32)"] = sizes.lora_params * 4 * copies / GB
        c["LoRA update state: grads + AdamW"] = sizes.lora_params * (4 + 8) / GB
    else:
        frozen = (t.objective == "nft") + (t.kl_beta > 0)  # v_old and the KL reference: frozen sharded copies
        shard = 4 if n > 1 else 0  # one process trains the resident policy in place: no second copy of the masters
        c["transformer (FP32, whole: the resident policy that samples)"] = P * 4 / GB
        what = f"trained shard (1/{n}) + " if n > 1 else ""
        c[f"trained update state: {what}grads + AdamW + {frozen} frozen copies"] = (
            P * (shard + 4 + 8 + 4 * frozen) / n / GB
        )
    if t.ema and n == 1:  # one process keeps the EMA beside the weights, on the device; ranks keep it on the host
        c["EMA of the trained weights (train.ema)"] = (sizes.lora_params if m.lora_rank else P) * 4 / GB
    tokens = image_tokens(config) + min(m.max_sequence_length, PROMPT_TOKENS)
    cfg = 2 if m.guidance > 1 and family_for(sizes.family).uses_true_cfg else 1
    micro = t.micro_batch or max(1, t.prompts_per_iteration * t.group_size // t.minibatches // n)
    per_block = tokens * sizes.hidden_size * act_bytes * micro * cfg
    saved = calibration.saved_per_token_width
    held = (sizes.num_blocks + saved) if t.gradient_checkpointing else sizes.num_blocks * saved
    c["activations of one micro-batch"] = held * per_block / GB
    chunk = s.rollout_batch or t.prompts_per_iteration * t.group_size
    c["sampling forward (no grad)"] = (
        calibration.inference_per_token_width * tokens * sizes.hidden_size * act_bytes * chunk * cfg / GB
    )
    c["VAE weights"] = sizes.vae_params * base_bytes / GB
    c["VAE decode of one chunk"] = (
        calibration.decode_bytes_per_pixel * m.resolution**2 * base_bytes * min(chunk, 8) / GB
    )
    c["text encoders (until every prompt is encoded)"] = sizes.text_encoder_params * base_bytes / GB
    c["reward model"] = reward_GB(t.reward)
    weights = [k for k in c if k.startswith(("transformer", "LoRA adapters"))]
    update_state = [k for k in c if k.startswith(("trained", "LoRA update", "EMA"))]
    phases = {
        "encode prompts (base version)": ["text encoders (until every prompt is encoded)"],
        # validation samples on the trainer's GPU whoever samples the rollouts (and one GPU's workers share it)
        "sample": [*weights, "sampling forward (no grad)", "VAE weights", "VAE decode of one chunk", "reward model"],
        "update": [*weights, *update_state, "activations of one micro-batch", "reward model"],
    }
    plan = MemoryPlan(c, phases, gpu_GB, notes=_notes(config, sizes, tokens, micro, cfg, calibration))
    plan.knobs = knobs(config, plan)
    return plan


def image_tokens(config: RunConfig) -> int:
    """Image tokens of one sample at the run's resolution (every family here: the VAE's factor 8, 2x2 patches)."""
    side = config.model.resolution // 16
    return side * side


def reward_GB(reward: str) -> float:
    """A reward model's weights on the trainer's GPU: a CLIP/PickScore folder's (read from its config), else 0 (rule
    rewards run on the CPU; an http:// reward runs on its own server)."""
    kind, _, path = reward.partition(":")
    if kind not in ("clip", "pickscore") or not path:
        return 0.0
    from workers.trainer.model_sizes import clip_params

    return clip_params(path) * 2 / GB


def knobs(config: RunConfig, plan: MemoryPlan) -> list[str]:
    """What lowers the peak phase, in the config tree's names."""
    m, t, s = config.model, config.train, config.sampling
    out = []
    if plan.peak_phase == "update":
        if not t.gradient_checkpointing:
            out.append("train.gradient_checkpointing true (--gradient-checkpointing)")
        if (t.micro_batch or 2) > 1:
            out.append(f"a smaller train.micro_batch (--micro-batch; now {t.micro_batch or 'the whole minibatch'})")
    if plan.peak_phase == "sample" and (s.rollout_batch or 2) > 1:
        out.append(f"a smaller sampling.rollout_batch (--rollout-batch; now {s.rollout_batch or 'all at once'})")
    if m.lora_rank == 0:
        out.append("a LoRA (model.lora_rank, --lora-rank 64): full fine-tuning keeps FP32 masters and AdamW state")
    elif m.base_dtype == "fp32":
        out.append("model.base_dtype bf16 (--base-dtype bf16): the frozen base in half the bytes")
    if m.resolution > 256:
        out.append(f"a lower model.resolution (--resolution; now {m.resolution})")
    out.append("a GPU with more memory")
    return out


def check_fits(plan: MemoryPlan) -> None:
    """MemoryPlanError saying the peak, the GPU and the knobs, unless the plan fits."""
    if plan.fits:
        return
    raise MemoryPlanError(
        f"this run needs about {plan.peak_GB:.1f} GB on each GPU ({plan.peak_phase} phase) but the GPU has "
        f"{plan.gpu_GB:g} GB ({HEADROOM_GB:g} GB kept for CUDA and NCCL): turn "
        + "; or ".join(plan.knobs)
        + " (spotlight config --memory GPU_GB prints the plan)"
    )


def _notes(config: RunConfig, sizes: ModelSizes, tokens: int, micro: int, cfg: int, calibration: Calibration):
    return [
        f"{sizes.family}: {sizes.transformer_params / 1e9:.2f}B transformer parameters in {sizes.num_blocks} blocks "
        f"of width {sizes.hidden_size}; LoRA {sizes.lora_params / 1e6:.1f}M; text encoders "
        f"{sizes.text_encoder_params / 1e9:.2f}B; VAE {sizes.vae_params / 1e6:.1f}M (built on the meta device)",
        f"activations: {tokens} tokens per sample ({PROMPT_TOKENS} assumed for the prompt at most), micro-batch "
        f"{micro} x {cfg} CFG pass(es), gradient checkpointing "
        f"{'on' if config.train.gradient_checkpointing else 'off'}",
        f"calibrated from one real-width block on the CPU: {calibration.saved_per_token_width:.1f} x tokens x width "
        f"saved per block, VAE decode {calibration.decode_bytes_per_pixel:.0f} x pixels ({calibration.source})",
        f"per rank of {config.train.nproc}; the GPU's own peaks are unverified (spotlight bench model-check)",
    ]


def format_plan(plan: MemoryPlan) -> str:
    """The plan as a table: each component's GB, each phase's total, the verdict."""
    width = max(len(k) for k in plan.components)
    lines = [f"{'component':<{width}}  {'GB':>7}"]
    lines += [f"{k:<{width}}  {v:>7.2f}" for k, v in plan.components.items()]
    lines.append("")
    for phase in plan.phases:
        mark = "  <- peak" if phase == plan.peak_phase else ""
        lines.append(f"{'phase: ' + phase:<{width}}  {plan.phase_GB(phase):>7.2f}{mark}")
    if plan.gpu_GB is not None:
        verdict = "fits" if plan.fits else "does NOT fit"
        lines.append(f"GPU {plan.gpu_GB:g} GB ({HEADROOM_GB:g} GB kept for CUDA): {verdict}")
        if not plan.fits:
            lines.append("turn: " + "; or ".join(plan.knobs))
    lines += ["", *plan.notes]
    return "\n".join(lines)


def plan_as_json(plan: MemoryPlan) -> dict:
    return {
        "components_GB": {k: round(v, 3) for k, v in plan.components.items()},
        "phases_GB": {p: round(plan.phase_GB(p), 3) for p in plan.phases},
        "peak_phase": plan.peak_phase,
        "peak_GB": round(plan.peak_GB, 3),
        "gpu_GB": plan.gpu_GB,
        "fits": plan.fits,
        "knobs": plan.knobs,
        "notes": plan.notes,
    }
