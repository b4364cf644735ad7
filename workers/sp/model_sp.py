"""SP for any policy a rollout request names: the pixel policy, or a diffusers family's (Qwen-Image, FLUX.1).

Ulysses splits the joint sequence N ways and exchanges heads for sequence with an all-to-all, so a group of N
ranks needs N to divide the attention heads, the image tokens (at the request's resolution) and the text tokens.
Text with a mask (Qwen-Image's `encoder_hidden_states_mask`, the pixel policy's) is padded with masked zero tokens
to a multiple of N; text without one (FLUX.1's T5 embeddings, always `max_sequence_length` long) must already
divide. A transformer that diffusers gives no context-parallel plan (SD3/3.5's `SD3Transformer2DModel` in diffusers
0.39) is refused at any degree above 1. Degree 1 changes nothing: the view is the policy itself, bit for bit.

Example:
    sp = sp_view(policy, 2)                      # ValueError naming what does not divide
    cond = sp.encode_prompts(["a red circle"])   # text padded for the degree
    v = sp.velocity(x, sigma_N, *cond)           # inside a group whose transformer has the hooks (ulysses.enable_sp)
    sp_degrees(policy, 8, ["a red circle"])      # e.g. [1, 2, 4, 8]
"""

from __future__ import annotations

import torch

from workers.model.families.family import Conditioning, read_config
from workers.model.families.identify import detect_family
from workers.model.families.model_spec import ModelSpec
from workers.model.families.registry import family_for
from workers.sp.ulysses import SequenceParallelPolicy, check_cp_plan, pad_text


def is_family_policy(policy) -> bool:
    """True for a diffusers family's policy (it has a ModelSpec), False for the pixel policy."""
    return hasattr(policy, "model_spec")


def check_family_degree(policy, degree: int) -> None:
    """ValueError unless `degree` ranks can split this family policy's transformer at its resolution."""
    _check_int_degree(degree)
    if degree == 1:
        return
    transformer, spec = policy.transformer, policy.model_spec
    check_cp_plan(transformer)
    heads = int(transformer.config.num_attention_heads)
    if heads % degree:
        raise ValueError(
            f"SP degree {degree} must divide the {heads} attention heads of {spec.family}'s "
            f"transformer (Ulysses gives each rank heads / degree)"
        )
    tokens = int(policy.latent_shape[0])
    if tokens % degree:
        raise ValueError(
            f"SP degree {degree} must divide the {tokens} image tokens of {spec.family} at resolution "
            f"{spec.resolution}; choose another resolution or degree"
        )


class FamilySequenceParallel:
    """What one rank of an SP group calls for a family policy: its conditioning with the text split-ready."""

    def __init__(self, policy, degree: int):
        check_family_degree(policy, degree)
        self.policy, self.degree = policy, degree

    def encode_prompts(self, prompts: list[str]):
        cond, mask = self.policy.encode_prompts(prompts)
        if self.degree == 1:
            return cond, mask
        family = self.policy.model_spec.family
        uncond = None if cond.uncond is None else split_ready_text(cond.uncond, self.degree, family)
        return Conditioning(split_ready_text(cond.cond, self.degree, family), uncond), mask

    def velocity(self, x: torch.Tensor, sigma_N: torch.Tensor, cond, mask=None) -> torch.Tensor:
        return self.policy.velocity(x, sigma_N, cond, mask)


def split_ready_text(inputs: dict[str, torch.Tensor], degree: int, family: str) -> dict[str, torch.Tensor]:
    """The transformer's text inputs with a length `degree` divides: masked text is padded with masked zero
    tokens; ValueError for unmasked text of another length (it cannot be padded without changing the output)."""
    text = inputs["encoder_hidden_states"]
    mask = inputs.get("encoder_hidden_states_mask")
    if mask is None:
        if text.shape[1] % degree:
            raise ValueError(
                f"SP degree {degree} must divide the {text.shape[1]} text tokens of {family}, which has "
                f"no text mask to pad with: set max_sequence_length to a multiple of {degree}"
            )
        return inputs
    text, mask = pad_text(text, mask, degree)
    return {**inputs, "encoder_hidden_states": text, "encoder_hidden_states_mask": mask}


def sp_view(policy, degree: int):
    """The policy as one rank of a group of `degree` sees it (ValueError when the degree does not fit)."""
    if is_family_policy(policy):
        return FamilySequenceParallel(policy, degree)
    return SequenceParallelPolicy(policy, degree)


def sp_degrees(policy, max_degree: int, prompts: list[str]) -> list[int]:
    """The SP degrees from 1 to max_degree that can split this policy's forwards for these prompts."""
    out = []
    for degree in range(1, max_degree + 1):
        try:
            sp_view(policy, degree).encode_prompts(prompts)
        except ValueError:
            continue
        out.append(degree)
    return out


def check_folder_degree(model: str, degree: int, spec_fields: dict | None = None) -> None:
    """ValueError when the transformer of the diffusers pipeline folder `model` cannot be split `degree` ways, as far
    as its config files tell (no weights load): a class diffusers gives no context-parallel plan, the attention heads,
    the image tokens at the run's resolution (`spec_fields`: the run's ModelSpec fields). What a request adds
    (another resolution, FLUX.1's unmasked text) is probed on the node, which gives back what it cannot split."""
    import diffusers

    _check_int_degree(degree)
    if degree == 1:
        return
    config = read_config(model, "transformer")
    name = str(config.get("_class_name"))
    if not getattr(getattr(diffusers, name, None), "_cp_plan", None):
        raise ValueError(
            f"{name}, the transformer of {model}, has no context-parallel plan (_cp_plan) in diffusers "
            f"{diffusers.__version__}, so it cannot be sampled in Ulysses groups: use SP degree 1 (one "
            "rollout worker per GPU)"
        )
    heads = int(config.get("num_attention_heads", 0))
    if heads % degree:
        raise ValueError(
            f"SP degree {degree} must divide the {heads} attention heads of {model}'s transformer "
            f"(Ulysses gives each rank heads / degree): choose one of "
            f"{[d for d in range(1, heads + 1) if heads % d == 0]}"
        )
    family = detect_family(model)
    spec = ModelSpec(path=str(model), family=family, **(spec_fields or {}))
    tokens = int(family_for(family).geometry(spec).latent_shape[0])
    if family_for(family).packed and tokens % degree:
        raise ValueError(
            f"SP degree {degree} must divide the {tokens} image tokens of {family} at resolution "
            f"{spec.resolution}; choose another resolution or degree"
        )


def _check_int_degree(degree: int) -> None:
    if isinstance(degree, bool) or not isinstance(degree, int) or degree < 1:
        raise ValueError(f"SP degree must be an int >= 1, got {degree!r}")


__all__ = [
    "FamilySequenceParallel",
    "check_family_degree",
    "check_folder_degree",
    "is_family_policy",
    "sp_degrees",
    "sp_view",
    "split_ready_text",
]
