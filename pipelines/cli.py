"""The `spotlight` command line: pretraining, the GRPO loop, benchmarks and the run ledger.

Heavy imports (torch, diffusers, dagster) happen inside each command, after argument
parsing, so `spotlight --help` answers at once. Commands live here or in their own module
(train_cli, run_cli, bench_cli), registered on `app`. Also `python -m pipelines.cli ...`
and `python -m pipelines ...`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

if TYPE_CHECKING:
    from workers.model.tiny_policy import Policy

app = typer.Typer(
    help="spotlight: GRPO post-training of flow-matching DiTs on spot GPUs.",
    no_args_is_help=True,
    add_completion=False,
)


def emit_json(record: dict) -> None:
    """One JSON object per line on stdout (JSON Lines)."""
    typer.echo(json.dumps(record, sort_keys=True))


def refuse_to_overwrite(out: Optional[Path], marker: str, overwrite: bool) -> None:
    """Fail before any compute when `out` already holds results (nothing written is lost silently)."""
    if out is not None and (out / marker).exists() and not overwrite:
        raise typer.BadParameter(f"{out} already holds a {marker}; choose another folder or pass --overwrite")


# `spotlight train`: the iteration driver in process (implementation in pipelines/train_cli.py).
from pipelines.train_cli import train_command  # noqa: E402

app.command("train")(train_command)


def save_in_place(policy: Policy, out: Path) -> None:
    """Write `policy` to `out` through a folder beside it, renamed in part by part (policy.json last): a
    pretraining stopped while writing leaves the previous save untouched; only the three renames are not one step."""
    import shutil

    from workers.model.tiny_policy import save_policy

    saving, old = out.with_name(out.name + ".saving"), out.with_name(out.name + ".old")
    shutil.rmtree(saving, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    save_policy(policy, saving)
    out.mkdir(parents=True, exist_ok=True)
    if (out / "transformer").exists():
        (out / "transformer").rename(old)
    (saving / "transformer").rename(out / "transformer")
    for name in ("text_encoder.safetensors", "policy.json"):
        (saving / name).replace(out / name)
    shutil.rmtree(saving, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)


@app.command()
def pretrain(
    out: Path = typer.Option(..., help="Folder to write the base policy to."),
    steps: int = typer.Option(2500, help="Flow-matching optimizer steps."),
    batch_size: int = typer.Option(32),
    lr: float = typer.Option(1e-3),
    seed: int = typer.Option(0),
    init: Optional[Path] = typer.Option(
        None,
        help="Continue from this policy folder instead of a random init (another task's: its transformer, with a "
        "new text encoder).",
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a policy already in --out."),
    as_json: bool = typer.Option(False, "--json", help="Print the final validation as JSON."),
    task: str = typer.Option("minigeneval", help="What to render: minigeneval scenes or miniocr strings."),
    save_every: int = typer.Option(
        0,
        min=0,
        help="Also save the policy to --out every this many steps (0: only at the end), so a stopped pretraining "
        "leaves a base to use or to continue with --init.",
    ),
) -> None:
    """Pretrain the tiny DiT by flow matching on rendered MiniGenEval scenes or MiniOCR strings (a base model)."""
    from workers.model.pretrain import PretrainConfig

    refuse_to_overwrite(out, "policy.json", overwrite)
    try:
        config = PretrainConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed, task=task)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from None
    from rich.progress import Progress

    from workers.model.pretrain import evaluate_base
    from workers.model.pretrain import pretrain as run_pretrain
    from workers.model.tiny_policy import PolicyConfig, build_policy, load_policy, save_policy, with_task

    if init is not None and not (init / "policy.json").exists():
        raise typer.BadParameter(
            f"--init {init} holds no policy (no policy.json); pass a folder written by "
            "`spotlight pretrain` or `spotlight train --out`"
        )
    policy = build_policy(PolicyConfig(task=task), seed=seed) if init is None else with_task(load_policy(init), task)

    def save(step: int) -> None:
        save_in_place(policy, out)
        typer.echo(f"step {step}/{steps}: saved {out}", err=True)

    every = max(1, steps // 50)  # where no progress bar shows (a log file), a line every 2 % of the steps
    with Progress(transient=not as_json) as progress:
        bar = progress.add_task("pretraining", total=steps)
        for step, loss in run_pretrain(policy, config, save, save_every):
            progress.update(bar, completed=step, description=f"pretraining  loss {loss:.4f}")
            if not progress.console.is_terminal and (step % every == 0 or step == steps):
                typer.echo(f"step {step}/{steps}  loss {loss:.4f}", err=True)
    save_policy(policy, out)
    result = evaluate_base(policy, task)
    record = {
        "steps": steps,
        "lr": lr,
        "seed": seed,
        "init": None if init is None else str(init),
        "task": task,
        "heldout_score": result.score,
        "heldout_partial": result.partial,
        "per_category": result.per_category,
    }
    if as_json:
        emit_json(record)
    else:
        typer.echo(f"saved {out}; held-out score {result.score:.3f} {result.per_category}")


@app.command("ledger")
def ledger_query(
    sql: str = typer.Argument(
        ..., help='Read-only SQL, e.g. "SELECT * FROM cost_per_iteration". Tables and views: docs/LEDGER.md.'
    ),
    db: Optional[Path] = typer.Option(
        None, "--db", help="Ledger file. Default: $SPOTLIGHT_LEDGER, else the newest runs/*/ledger.duckdb."
    ),
    as_csv: bool = typer.Option(False, "--csv", help="Print CSV instead of a table."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object per row (JSON Lines)."),
) -> None:
    """Query a run ledger with read-only SQL; works while the run is writing it."""
    import csv
    import io

    from resources.ledger.db import LedgerLockedError, LedgerQueryError, find_ledger, query_ledger

    if as_csv and as_json:
        raise typer.BadParameter("choose one of --csv and --json")
    try:
        result = query_ledger(find_ledger(db), sql)
    except (FileNotFoundError, LedgerLockedError, LedgerQueryError) as err:
        typer.echo(f"spotlight ledger: {err}", err=True)
        raise typer.Exit(1) from err
    if as_json:
        for row in result.as_dicts():  # column order kept, unlike emit_json's sorted keys
            typer.echo(json.dumps(row, default=str))
    elif as_csv:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(result.columns)
        writer.writerows(result.rows)
        typer.echo(buffer.getvalue(), nl=False)
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(*result.columns)
        for row in result.rows:
            table.add_row(*("" if v is None else format(v, ".6g") if isinstance(v, float) else str(v) for v in row))
        Console().print(table)
        typer.echo(f"{len(result.rows)} rows")


# `spotlight run`: the pipeline's main job (implementation in pipelines/run.py; run_cli imports only typer).
from pipelines.run_cli import run_command  # noqa: E402

app.command("run")(run_command)

# `spotlight config`: the resolved config tree a run would run with (pipelines/config_cli.py).
from pipelines.config_cli import config_command  # noqa: E402

app.command("config")(config_command)

# `spotlight bench ...`: benchmarks (pipelines/bench_cli.py imports only typer).
from pipelines.bench_cli import bench_app  # noqa: E402

app.add_typer(bench_app, name="bench")

# `spotlight simulate` / `spotlight plan`: cost at scale on simulated time (pipelines/sim_cli.py imports only typer).
from pipelines.sim_cli import plan_command, simulate_calibrate_command, simulate_command  # noqa: E402

app.command("simulate")(simulate_command)
app.command("plan")(plan_command)
app.command("simulate-calibrate")(simulate_calibrate_command)

# `spotlight launch` / `status` / `down`: the cloud path on SkyPilot (pipelines/launch_cli.py imports only typer).
from pipelines.launch_cli import down_command, launch_command, status_command  # noqa: E402
from pipelines.launch_config import LAUNCH_CONTEXT, RUN_SETTINGS_HELP  # noqa: E402

app.command("launch", context_settings=LAUNCH_CONTEXT, epilog=RUN_SETTINGS_HELP)(launch_command)
app.command("status")(status_command)
app.command("down")(down_command)

# `spotlight reward-serve`: a reward behind HTTP on its own GPU (pipelines/reward_cli.py imports only typer).
from pipelines.reward_cli import reward_serve_command  # noqa: E402

app.command("reward-serve")(reward_serve_command)


if __name__ == "__main__":
    app(prog_name="spotlight")
