"""The iteration's closing assets: `validation` (held-out score of weights version k) and `report`.

`report` ends the iteration in the ledger (the final partition also ends the run) and
rewrites the run's report folder next to the ledger (`<run-dir>/report/index.html`).
"""


from pathlib import Path

import dagster as dg
from dagster import AssetExecutionContext

from assets import bookkeeping as books
from assets.iteration import GROUP, _cost, _write_grid, policy_update, seed_plan, weight_patch
from assets.metadata import image_grid_png, line_plot_png, png_markdown
from assets.partitions import ITERATIONS, iteration_of
from assets.run_config import RunConfigResource
from resources.dagster_resources import LedgerResource, TensorStoreResource
from resources.keys import iteration_label

GUARD_CHECK = "validation_not_below_guard"


def report_dir(ledger: LedgerResource) -> Path:
    return Path(ledger.path).parent / "report"


@dg.asset(partitions_def=ITERATIONS, group_name=GROUP, deps=[weight_patch], kinds={"pytorch"},
          check_specs=[dg.AssetCheckSpec(GUARD_CHECK, asset="validation",
                                         description="The held-out score is not more than max_validation_drop below the base's.")])
def validation(context: AssetExecutionContext, run_config: RunConfigResource, store: TensorStoreResource,
               ledger: LedgerResource) -> dg.MaterializeResult:
    """Validate: held-out prompts, fixed seeds, ODE sampling, GenEval-style score of weights version k."""
    k, led = iteration_of(context), ledger.get_ledger()
    if not run_config.validates(k):
        check = dg.AssetCheckResult(check_name=GUARD_CHECK, passed=True, metadata={"validated": False})
        return dg.MaterializeResult(metadata={"validated": False, "validate_every": run_config.train_config().validate_every},
                                    check_results=[check])
    from workers.task.evaluate import evaluate
    from workers.task.prompts import split_prompts
    from workers.trainer.checkpoint import load_checkpoint

    policy, _ = load_checkpoint(store.get_store(), run_config.run, k)
    with books.phase(led, k, "validate"):
        result = evaluate(policy, split_prompts()["heldout"], run_config.train_config().validation_seeds, keep_images=True)
    criteria = {**result.per_criterion, **{f"category.{c}": v for c, v in result.per_category.items()}}
    led.record_validation(k, weights_version=k, score=result.score, num_prompts=len(set(result.prompts)), criteria=criteria)
    seeds = run_config.train_config().validation_seeds
    grid = image_grid_png(result.images[::seeds], columns=8)
    _write_grid(ledger, f"{iteration_label(k)}-validation.png", grid)
    curve = led.query("SELECT weights_version, score FROM validation ORDER BY weights_version").rows
    base = books.base_validation_score(led)
    guard = None if base is None else base - run_config.max_validation_drop
    meta = {"weights_version": k, "score": result.score, "partial": result.partial, "base_score": base, "guard": guard,
            **{f"category/{c}": v for c, v in result.per_category.items()},
            "curve": png_markdown(line_plot_png({"held-out": ([r[0] for r in curve], [r[1] for r in curve])},
                                                "validation", "weights version", "strict score"), "held-out score so far"),
            "samples": png_markdown(grid, "held-out prompts, first fixed seed"), **_cost(led, k, "validate")}
    check = dg.AssetCheckResult(check_name=GUARD_CHECK, passed=guard is None or result.score >= guard,
                                metadata={"score": result.score, "guard": guard})
    return dg.MaterializeResult(metadata=meta, check_results=[check])


@dg.asset(partitions_def=ITERATIONS, group_name=GROUP, deps=[validation, policy_update, seed_plan])
def report(context: AssetExecutionContext, run_config: RunConfigResource, store: TensorStoreResource,
           ledger: LedgerResource) -> dg.MaterializeResult:
    """Close the iteration in the ledger and rewrite the run's report folder (curves, cost, preemptions, sync, grids)."""
    from pipelines.report import write_report

    k, led = iteration_of(context), ledger.get_ledger()
    books.end_iteration(led, run_config, k)
    written = write_report(led, store.get_store(), run_config.run, report_dir(ledger))
    cost = led.query("SELECT usd_total, usd_spot, usd_reserved, critical_path_s FROM cost_per_iteration WHERE iteration = ?", [k]).as_dicts()
    meta = {"report": dg.MetadataValue.path(str(written.index)), "final": k >= run_config.num_iterations,
            **{f"iteration_{name}": float(v or 0.0) for name, v in (cost[0] if cost else {}).items()},
            "rewards": png_markdown(written.plots["reward"], "reward per iteration"),
            "cost": png_markdown(written.plots["cost"], "cost per iteration")}
    return dg.MaterializeResult(metadata=meta)

