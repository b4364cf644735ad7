"""`--prompts FILE` and `--prompts-heldout F`, shared by `spotlight train` and `spotlight run`: the user's training
prompts, read and checked against the run's policy before any weights load (workers/task/prompt_file.py). Only
typer at import time."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


def with_prompts(config, prompts: Optional[Path], heldout: float, model: Optional[Path], model_fields):
    """`config` training on `--prompts` (read and checked against the policy now); BadParameter saying what to fix."""
    import dataclasses

    from workers.trainer.presets import training_prompts

    if prompts is None:
        if heldout:
            raise typer.BadParameter("--prompts-heldout applies to --prompts FILE")
        return config
    try:
        source = training_prompts(str(prompts), heldout, None if model is None else str(model), model_fields)
        return dataclasses.replace(config, prompts=source, train_categories=None)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--prompts") from None
