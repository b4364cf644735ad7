"""Whether a prompts file fits a family's text encoder: each prompt's tokens counted with the folder's own tokenizer
(no weights load), refused with its line number when the encoder would cut it.

Example:
    spec = ModelSpec(path="/models/Qwen-Image", family="qwen-image")
    check_prompts_fit(PromptSource.from_file("prompts.jsonl"), spec)
"""

from __future__ import annotations

from workers.model.families.family import quiet_loading
from workers.model.families.model_spec import ModelSpec
from workers.model.families.registry import family_for


def prompt_token_limit(spec: ModelSpec) -> tuple[str, int, bool]:
    """(tokenizer subfolder, most tokens the family's main text encoder keeps, whether to count special tokens):
    Qwen-Image's Qwen2.5-VL and FLUX.1's T5 keep max_sequence_length, SD3's T5 at most 256 (its pipeline's cap).
    CLIP's 77 tokens are left out: every one of these pipelines truncates CLIP by design."""
    family = family_for(spec.family)
    if family.name == "qwen-image":
        return "tokenizer", spec.max_sequence_length, False  # the chat template's tokens are dropped after encoding
    if family.name == "sd3":
        return "tokenizer_3", min(spec.max_sequence_length, 256), True
    return "tokenizer_2", spec.max_sequence_length, True


def check_prompts_fit(source, spec: ModelSpec) -> None:
    """ValueError naming the first prompt (with its line) longer than the family's text encoder takes."""
    from transformers import AutoTokenizer

    subfolder, limit, special = prompt_token_limit(spec)
    quiet_loading()
    tokenizer = AutoTokenizer.from_pretrained(spec.path, subfolder=subfolder, local_files_only=True)
    for row in source.table().rows:
        count = len(tokenizer(row.text, add_special_tokens=special, truncation=False)["input_ids"])
        if count > limit:
            raise ValueError(
                f"--prompts {source.path}: line {row.line}: the prompt has {count} tokens; {spec.family}'s "
                f"text encoder takes {limit} (max_sequence_length), so it would be cut: shorten it"
            )
