"""The synchronous GRPO loop behind `spotlight train`: validate, then rollout -> update per iteration.

Yields one plain dict per iteration (JSON-ready). Iteration 0 is the starting policy's
held-out validation; iterations 1..N are training iterations, validated every
`validate_every` iterations and after the last one (validation_score is None otherwise).

Example:
    for record in run_training(load_policy(), cpu_tiny()):
        print(record["iteration"], record["reward_mean"], record["validation_score"])
"""

from __future__ import annotations

import time
from typing import Iterator

from workers.task.evaluate import EvalResult, evaluate
from workers.task.prompts import split_prompts
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig


def _validation_fields(result: EvalResult | None) -> dict:
    if result is None:
        return {"validation_score": None, "validation_partial": None, "validation_per_category": None,
                "validation_per_criterion": None, "validation_num_prompts": None}
    return {
        "validation_score": round(result.score, 6),
        "validation_partial": round(result.partial, 6),
        "validation_per_category": {k: round(v, 6) for k, v in result.per_category.items()},
        "validation_per_criterion": {k: round(v, 6) for k, v in result.per_criterion.items()},
        "validation_num_prompts": len(set(result.prompts)),
    }


def run_training(policy, config: TrainConfig, heldout: list[str] | None = None) -> Iterator[dict]:
    """Train `policy` in place for config.iterations GRPO iterations, yielding a record per iteration."""
    heldout = heldout if heldout is not None else split_prompts()["heldout"]
    trainer = GRPOTrainer(policy, config)
    base = evaluate(policy, heldout, config.validation_seeds)
    yield {"iteration": 0, **_validation_fields(base)}
    for it in range(1, config.iterations + 1):
        t0 = time.perf_counter()
        batch = trainer.collect(it)
        record = {"iteration": it, **trainer.batch_stats(batch), **trainer.update(batch)}
        record["step_s"] = time.perf_counter() - t0
        validate = it % config.validate_every == 0 or it == config.iterations
        record.update(_validation_fields(evaluate(policy, heldout, config.validation_seeds) if validate else None))
        yield {k: round(v, 6) if isinstance(v, float) else v for k, v in record.items()}
