"""The `spotlight train` command (registered in pipelines/cli.py): the coordinator's iteration driver in this
process, with in-process sampling; its run settings' options come from resources/settings/. Only typer and
stdlib modules at import time: `--help` stays instant."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import typer

from pipelines.config_file import config_option
from pipelines.prompts_cli import with_prompts
from pipelines.ranks_cli import check_ranks, in_ranks, with_batch_options
from pipelines.settings_cli import settings_options
from resources.settings import check_bounds, settings_class

TRAIN_DEFAULTS = {"preset": "cpu_tiny_long", "prompts_heldout": 0.0}
"""Where `spotlight train`'s defaults differ from the settings' (a longer CPU preset; no prompts held out)."""
TrainSettings = settings_class("train", defaults=TRAIN_DEFAULTS)
"""The typed settings of one `spotlight train` (resources/settings/)."""
RUN_FILES = ("metrics.jsonl", "ledger.duckdb", "store", "report", "policy")
"""What `--out` holds after a run (`--overwrite` removes them first)."""


@settings_options("train", defaults=TRAIN_DEFAULTS)
def train_command(
    lr: Optional[float] = typer.Option(None, help="Override the preset's learning rate."),
    rollouts_per_prompt: Optional[int] = typer.Option(
        None, help="Samples drawn per prompt; the update keeps the group's size of largest reward variance."
    ),
    out: Optional[Path] = typer.Option(
        None, help="Run folder: metrics.jsonl, ledger.duckdb, store/, report/ and the final policy/."
    ),
    usd_per_hour: float = typer.Option(
        0.10, help="Price of this machine for the ledger (default: roughly a 2-vCPU on-demand VM)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the results already in --out."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per iteration (JSON Lines)."),
    config_file: Optional[Path] = config_option(),
    **settings,
) -> None:
    """Synchronous GRPO post-training in this process: MiniGenEval, or --model DIR on --prompts FILE with --reward."""
    run = TrainSettings(**settings)
    try:
        check_bounds(run, "train")
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    model_fields = _model_fields(
        run.preset, run.model, run.checkpoint, run.lora_rank, run.resolution, run.guidance, run.sync_mode
    )
    config = with_batch_options(
        _config(run.preset, run.iterations, run.seed, lr, rollouts_per_prompt, run.reward),
        run.rollout_batch,
        run.micro_batch,
        run.group_size,
        run.prompts_per_iteration,
        run.minibatches,
        run.advantage,
    )
    config = with_prompts(config, run.prompts, run.prompts_heldout, run.model, model_fields)
    validation = _validation(
        run.validation_reward, run.validation_prompts, config.reward, run.model is not None, config.prompts
    )
    hacking = hacking_options(*(getattr(run, name) for name in HACKING_SETTINGS))
    _check_run_options(run.explore_samples, usd_per_hour, run.checkpoint, out, overwrite, run.device, run.nproc, config)
    _train_in_ranks(
        out,
        run.nproc,
        run.gradient_checkpointing,
        preset=run.preset,
        config=config,
        checkpoint=run.model or run.checkpoint,
        usd_per_hour=usd_per_hour,
        as_json=as_json,
        model_fields=model_fields,
        device=run.device,
        validation=validation,
        explore_samples=run.explore_samples,
        hacking=hacking,
    )


HACKING_SETTINGS = (
    "on_hacking",
    "hacking_window",
    "hacking_z",
    "hacking_max_drop",
    "hacking_max_rise",
    "rollback_lr_scale",
    "rollback_kl_beta",
)
"""The reward-hacking guard's settings, in hacking_from_options' order."""


def _train_in_ranks(out: Optional[Path], nproc: int, gradient_checkpointing: Optional[bool], **train_args) -> None:
    """`_train` in this process (rank 0 of `nproc`), into `out` or a temporary folder removed afterwards; the
    command exits with its code. Gradient checkpointing, unless told, is on for the GPU presets."""
    if gradient_checkpointing is None:
        from workers.trainer.presets import checkpointing_by_default

        gradient_checkpointing = checkpointing_by_default(train_args["preset"])
    run_dir = out.resolve() if out is not None else Path(tempfile.mkdtemp(prefix="spotlight-train-"))
    try:
        code = in_ranks(
            nproc,
            gradient_checkpointing,
            train_args["device"],
            _train,
            {"run_dir": run_dir, "keep": out is not None, **train_args},
        )
    finally:
        if out is None:
            shutil.rmtree(run_dir, ignore_errors=True)
    if code:
        raise typer.Exit(code)


def _check_run_options(
    explore_samples,
    usd_per_hour: float,
    checkpoint: Optional[Path],
    out: Optional[Path],
    overwrite: bool,
    device: str,
    nproc: int,
    config,
) -> None:
    """BadParameter for a bad device, rank count, budget, price or checkpoint, or an --out that holds a run; with
    --overwrite that run is removed, last, once everything else has passed."""
    _check_device(device)
    check_ranks(nproc, device, config)
    if explore_samples is not None and not explore_samples > 0:
        raise typer.BadParameter(
            f"--explore-samples must be > 0 (full-sampler samples per iteration), got {explore_samples}"
        )
    if usd_per_hour < 0:
        raise typer.BadParameter(f"--usd-per-hour must be >= 0, got {usd_per_hour}")
    if checkpoint is not None and not (checkpoint / "policy.json").is_file():
        raise typer.BadParameter(
            f"--checkpoint {checkpoint} holds no policy (no policy.json); pass a folder written "
            "by `spotlight pretrain` or `spotlight train --out`"
        )
    if out is not None and any((out / name).exists() for name in RUN_FILES):
        if not overwrite:
            raise typer.BadParameter(f"{out} already holds a run; choose another folder or pass --overwrite")
        for name in RUN_FILES:
            path = out / name
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


def _validation(reward: Optional[str], prompts: Optional[Path], train_reward: str, model: bool, train_prompts=None):
    from workers.task.validation import validation_from_options

    try:
        return validation_from_options(reward, prompts, train_reward, model, train_prompts)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def hacking_options(on_hacking, window, z, max_drop, max_rise, lr_scale, kl_beta):
    """The reward-hacking guard's config from `--on-hacking` and its companions (also `spotlight run`'s)."""
    from workers.coordinator.hacking_guard import hacking_from_options

    try:
        return hacking_from_options(on_hacking, window, z, max_drop, max_rise, lr_scale, kl_beta)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def _check_device(device: str) -> None:
    from workers.coordinator.context import check_device

    try:
        check_device(device)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--device") from None


def _model_fields(
    preset: str, model: Optional[Path], checkpoint: Optional[Path], lora_rank, resolution, guidance, sync_mode=None
) -> Optional[dict]:
    """ModelSpec fields for --model (the preset's defaults, then the command line's); None without --model.
    A folder that is not a supported pipeline, or a resolution it cannot pack, fails here, before weights load."""
    given = {"lora_rank": lora_rank, "resolution": resolution, "guidance": guidance, "sync_mode": sync_mode}
    if model is None:
        if any(v is not None for v in given.values()):
            raise typer.BadParameter(
                f"{sorted(k for k, v in given.items() if v is not None)} apply to --model (a diffusers pipeline folder)"
            )
        return None
    if checkpoint is not None:
        raise typer.BadParameter("pass --model (a diffusers pipeline) or --checkpoint (a spotlight policy), not both")
    from workers.trainer.presets import model_fields_for

    try:
        return model_fields_for(preset, str(model), **given)
    except ValueError as err:  # UnsupportedModelError is one
        raise typer.BadParameter(str(err)) from None


def _config(preset: str, iterations, seed, lr, rollouts_per_prompt, reward=None):
    """The preset with the command line's overrides; a bad value fails here, before any compute."""
    import dataclasses

    from workers.trainer.grpo_trainer import check_reward_chosen
    from workers.trainer.presets import get_preset

    try:
        config = get_preset(preset)
        changes = {
            k: v
            for k, v in {
                "iterations": iterations,
                "seed": seed,
                "rollouts_per_prompt": rollouts_per_prompt,
                "reward": reward,
            }.items()
            if v is not None
        }
        if lr is not None:
            changes["grpo"] = dataclasses.replace(config.grpo, lr=lr)
        config = dataclasses.replace(config, **changes)
        check_reward_chosen(config, preset)
        return config
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None


def _train(run_dir: Path, keep: bool, as_json: bool, **context_args) -> int:
    """The run; returns the exit code (3: stopped by the reward-hacking guard, --on-hacking stop)."""
    from rich.console import Console

    from workers.coordinator import books

    run_dir.mkdir(parents=True, exist_ok=True)
    ctx = _run_context(run_dir, keep, **context_args)
    console = Console(stderr=True)
    succeeded, stopped = False, None
    try:
        stopped = _drive(ctx, run_dir, console, as_json)
        succeeded = stopped is None
    finally:
        if not succeeded:
            books.interrupt_run(ctx.ledger, ctx.run)
        ctx.ledger.close()
    if stopped is not None:
        console.print(
            f"stopped: the reward-hacking guard flagged iteration {stopped['iteration']} "
            f"({stopped['hacking_rule']}); the run is marked interrupted, its signals are in "
            f"SELECT * FROM reward_hacking (--db {run_dir / 'ledger.duckdb'})"
        )
        return 3
    if keep:
        _save_final_policy(ctx, run_dir)
        console.print(
            f"saved the trained policy to {run_dir / 'policy'}; report {run_dir / 'report' / 'index.html'}; "
            f'query the run with spotlight ledger "SELECT * FROM validation_curve" --db {run_dir / "ledger.duckdb"}'
        )
    return 0


def _run_context(
    run_dir: Path,
    keep: bool,
    preset: str,
    config,
    checkpoint: Optional[Path],
    usd_per_hour: float,
    model_fields: Optional[dict] = None,
    device: str = "cpu",
    validation=None,
    explore_samples: Optional[float] = None,
    hacking=None,
):
    """The coordinator's RunContext of this run: local store, queue and ledger in `run_dir`, in-process sampling
    (exploring on `explore_samples` per iteration when given)."""
    import dataclasses

    from workers.coordinator.context import RunContext, Sampling, run_name_for

    ctx = RunContext.local(
        run_dir,
        run_name_for(run_dir) if keep else "train",
        preset,
        config,
        checkpoint=None if checkpoint is None else str(Path(checkpoint).resolve()),
        reserved_usd_per_hour=usd_per_hour,
        report=keep,
        model=model_fields,
        device=device,
        validation=validation,
        hacking=hacking,
    )
    if explore_samples is not None:
        ctx = dataclasses.replace(ctx, sampling=Sampling(mode="inprocess", explore_samples=explore_samples))
    return ctx


def _drive(ctx, run_dir: Path, console, as_json: bool) -> Optional[dict]:
    """Every iteration of the driver, each record a line (JSON with --json) and a line of metrics.jsonl; returns the
    record that asked the run to stop (the reward-hacking guard), else None."""
    from rich.progress import Progress

    from workers.coordinator.driver import train_records

    stopped = None
    with Progress(console=console, transient=True) as progress, (run_dir / "metrics.jsonl").open("w") as metrics:
        task = progress.add_task("GRPO", total=ctx.train.iterations + 1)
        for record in train_records(ctx):
            line = json.dumps(record, sort_keys=True)
            if as_json:
                typer.echo(line)
            else:
                progress.console.print(_human_line(record))
            metrics.write(line + "\n")
            metrics.flush()
            progress.update(task, completed=record["iteration"] + 1)
            if record.get("hacking_action") == "stop":
                stopped = record
    return stopped


def _save_final_policy(ctx, run_dir: Path) -> None:
    from workers.model.tiny_policy import save_policy
    from workers.trainer.resident import resident_checkpoint

    policy, _ = resident_checkpoint(ctx.store, ctx.run, ctx.num_iterations)
    if ctx.model is not None:
        from workers.model.families.diffusers_policy import save_model_policy

        save_model_policy(policy, run_dir / "policy")
    else:
        save_policy(policy, run_dir / "policy")


def _human_line(r: dict) -> str:
    val = "" if r.get("validation_score") is None else f"  held-out {r['validation_score']:.3f}"
    if r.get("hacking_flagged"):
        val += f"  REWARD HACKING? {r['hacking_rule']} ({r['hacking_action']})"
    if "reward_mean" not in r:
        return f"it {r['iteration']:>3}  (final weights){val}"
    return (
        f"it {r['iteration']:>3}  reward {r['reward_mean']:.3f} ± {r['reward_std']:.3f}  "
        f"zero-std {r['zero_std_ratio']:.2f}  step {r['step_s']:.1f}s{val}"
    )
