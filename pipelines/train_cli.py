"""The `spotlight train` command (registered in pipelines/cli.py): the coordinator's iteration driver in this
process, with in-process sampling. Only typer at import time: `--help` stays instant."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import typer

from pipelines.config_file import config_option
from pipelines.prompts_cli import PROMPTS_HELDOUT_HELP, PROMPTS_HELP, with_prompts
from pipelines.ranks_cli import (
    ADVANTAGE_HELP,
    CHECKPOINTING_HELP,
    MICRO_BATCH_HELP,
    NPROC_HELP,
    ROLLOUT_BATCH_HELP,
    check_ranks,
    in_ranks,
    with_batch_options,
)

RUN_FILES = ("metrics.jsonl", "ledger.duckdb", "store", "report", "policy")
"""What `--out` holds after a run (`--overwrite` removes them first)."""


def train_command(
    iterations: Optional[int] = typer.Option(None, help="GRPO iterations (default: the preset's)."),
    preset: str = typer.Option("cpu_tiny_long", help="Training preset (workers/trainer/presets.py)."),
    checkpoint: Optional[Path] = typer.Option(None, help="Policy folder to start from (default: the shipped base)."),
    model: Optional[Path] = typer.Option(
        None,
        help="A diffusers pipeline folder to post-train (Qwen-Image, SD3/3.5, "
        "FLUX.1), loaded locally; nothing is downloaded.",
    ),
    lora_rank: Optional[int] = typer.Option(
        None, help="With --model: a LoRA of this rank (0 = full fine-tuning; default: the preset's, else 0)."
    ),
    resolution: Optional[int] = typer.Option(
        None, help="With --model: image side in pixels (default: the preset's, else 512)."
    ),
    guidance: Optional[float] = typer.Option(None, help="With --model: true-CFG scale, or FLUX.1-dev's guidance."),
    sync_mode: Optional[str] = typer.Option(
        None,
        "--sync-mode",
        help="With --model and a LoRA: what PULSE ships to "
        "rollout workers, lora (the adapter; default) or merged (BF16 base + "
        "LoRA delta of every weight: workers need no adapter).",
    ),
    reward: Optional[str] = typer.Option(None, help="Reward name (default: the preset's)."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help=PROMPTS_HELP),
    prompts_heldout: float = typer.Option(0.0, "--prompts-heldout", help=PROMPTS_HELDOUT_HELP),
    validation_reward: Optional[str] = typer.Option(
        None,
        "--validation-reward",
        help="Reward that scores the held-out images, averaged over prompts x fixed seeds (default: MiniGenEval's detector; with --model the run's reward).",
    ),
    validation_prompts: Optional[Path] = typer.Option(
        None,
        "--validation-prompts",
        help="A text file of held-out prompts, one a line, # for comments (default: MiniGenEval's held-out split).",
    ),
    on_hacking: str = typer.Option(
        "warn",
        "--on-hacking",
        help="When the reward-hacking guard flags a validation (docs/REWARD_HACKING.md): warn (record it), stop (end the run after that iteration) or rollback (continue from the best-gold weights at a lower lr / stronger KL).",
    ),
    hacking_window: Optional[int] = typer.Option(
        None,
        "--hacking-window",
        help="Validations back the guard compares the proxy and gold rewards over (default 2).",
    ),
    hacking_z: Optional[float] = typer.Option(
        None, "--hacking-z", help="Standard errors the proxy's rise and the gold's fall must each exceed (default 2)."
    ),
    hacking_max_drop: Optional[float] = typer.Option(
        None,
        "--hacking-max-drop",
        help="Largest relative fall of a held-out image statistic below the base's before the guard fires (default 0.5; 0 = off).",
    ),
    hacking_max_rise: Optional[float] = typer.Option(
        None,
        "--hacking-max-rise",
        help="Largest relative rise of a held-out image statistic above the base's (default: rises never fire).",
    ),
    rollback_lr_scale: Optional[float] = typer.Option(
        None,
        "--rollback-lr-scale",
        help="With --on-hacking rollback: multiply the learning rate by this per rollback (default 0.5).",
    ),
    rollback_kl_beta: Optional[float] = typer.Option(
        None,
        "--rollback-kl-beta",
        help="With --on-hacking rollback: train on with at least this KL coefficient to the base (default: the preset's).",
    ),
    device: str = typer.Option("cpu", help="Where training, sampling and validation run: cpu, cuda or cuda:N."),
    seed: Optional[int] = typer.Option(None, help="Run seed: prompt schedule and request seeds."),
    lr: Optional[float] = typer.Option(None, help="Override the preset's learning rate."),
    rollouts_per_prompt: Optional[int] = typer.Option(
        None, help="Samples drawn per prompt; the update keeps the group's size of largest reward variance."
    ),
    explore_samples: Optional[float] = typer.Option(
        None,
        "--explore-samples",
        help="Explore the next iteration's seeds on the stale weights after each update, "
        "within this many full-sampler samples per iteration (a spot pool's budget, in this process: docs/EXPLORATION.md).",
    ),
    out: Optional[Path] = typer.Option(
        None, help="Run folder: metrics.jsonl, ledger.duckdb, store/, report/ and the final policy/."
    ),
    nproc: int = typer.Option(1, "--nproc", help=NPROC_HELP),
    gradient_checkpointing: Optional[bool] = typer.Option(
        None,
        "--gradient-checkpointing/--no-gradient-checkpointing",
        help=CHECKPOINTING_HELP + " Default: on for the GPU presets.",
        show_default=False,
    ),
    usd_per_hour: float = typer.Option(
        0.10, help="Price of this machine for the ledger (default: roughly a 2-vCPU on-demand VM)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the results already in --out."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per iteration (JSON Lines)."),
    rollout_batch: Optional[int] = typer.Option(None, "--rollout-batch", help=ROLLOUT_BATCH_HELP),
    micro_batch: Optional[int] = typer.Option(None, "--micro-batch", help=MICRO_BATCH_HELP),
    group_size: Optional[int] = typer.Option(
        None, "--group-size", help="Samples per prompt the update compares (GRPO's group; default: the preset's)."
    ),
    prompts_per_iteration: Optional[int] = typer.Option(
        None, "--prompts-per-iteration", help="Prompts sampled per iteration (default: the preset's)."
    ),
    minibatches: Optional[int] = typer.Option(
        None,
        "--minibatches",
        help="Optimizer steps per epoch: the iteration's samples split into this many minibatches (default: the preset's).",
    ),
    advantage: Optional[str] = typer.Option(None, "--advantage", help=ADVANTAGE_HELP),
    config_file: Optional[Path] = config_option(),
) -> None:
    """Synchronous GRPO post-training in this process: MiniGenEval, or --model DIR on --prompts FILE with --reward."""
    model_fields = _model_fields(preset, model, checkpoint, lora_rank, resolution, guidance, sync_mode)
    config = with_batch_options(
        _config(preset, iterations, seed, lr, rollouts_per_prompt, reward),
        rollout_batch,
        micro_batch,
        group_size,
        prompts_per_iteration,
        minibatches,
        advantage,
    )
    config = with_prompts(config, prompts, prompts_heldout, model, model_fields)
    validation = _validation(validation_reward, validation_prompts, config.reward, model is not None, config.prompts)
    hacking = hacking_options(
        on_hacking, hacking_window, hacking_z, hacking_max_drop, hacking_max_rise, rollback_lr_scale, rollback_kl_beta
    )
    _check_run_options(explore_samples, usd_per_hour, checkpoint, out, overwrite, device, nproc, config)
    _train_in_ranks(
        out,
        nproc,
        gradient_checkpointing,
        preset=preset,
        config=config,
        checkpoint=model or checkpoint,
        usd_per_hour=usd_per_hour,
        as_json=as_json,
        model_fields=model_fields,
        device=device,
        validation=validation,
        explore_samples=explore_samples,
        hacking=hacking,
    )


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


def _train(
    run_dir: Path,
    preset: str,
    config,
    checkpoint: Optional[Path],
    usd_per_hour: float,
    as_json: bool,
    keep: bool,
    model_fields: Optional[dict] = None,
    device: str = "cpu",
    validation=None,
    explore_samples: Optional[float] = None,
    hacking=None,
) -> int:
    """The run; returns the exit code (3: stopped by the reward-hacking guard, --on-hacking stop)."""
    from rich.console import Console
    from rich.progress import Progress

    from workers.coordinator import books
    from workers.coordinator.context import RunContext, run_name_for
    from workers.coordinator.driver import train_records

    run_dir.mkdir(parents=True, exist_ok=True)
    ctx = RunContext.local(
        run_dir,
        run_name_for(run_dir) if keep else "train",
        preset,
        config,
        checkpoint=None if checkpoint is None else str(checkpoint.resolve()),
        reserved_usd_per_hour=usd_per_hour,
        report=keep,
        model=model_fields,
        device=device,
        validation=validation,
        hacking=hacking,
    )
    if explore_samples is not None:
        import dataclasses

        from workers.coordinator.context import Sampling

        ctx = dataclasses.replace(ctx, sampling=Sampling(mode="inprocess", explore_samples=explore_samples))
    console = Console(stderr=True)
    succeeded, stopped = False, None
    try:
        with Progress(console=console, transient=True) as progress, (run_dir / "metrics.jsonl").open("w") as metrics:
            task = progress.add_task("GRPO", total=config.iterations + 1)
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


def _save_final_policy(ctx, run_dir: Path) -> None:
    from workers.model.policy import save_policy
    from workers.trainer.resident import resident_checkpoint

    policy, _ = resident_checkpoint(ctx.store, ctx.run, ctx.num_iterations)
    if ctx.model is not None:
        from workers.model.families.policy import save_model_policy

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
