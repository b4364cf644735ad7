"""The CLI refuses bad input before spending compute, and prints JSON Lines with --json."""

import json

import pytest
from typer.testing import CliRunner

from pipelines.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    "args,message",
    [
        (["--lr", "-0.001"], "lr"),
        (["--preset", "gpu_huge"], "unknown preset"),
        (["--iterations", "0"], "iterations"),
        (["--rollouts-per-prompt", "4"], "train.rollouts_per_prompt=4 must be >= train.group_size=8"),
        (["--explore-samples", "0"], "--explore-samples: explore.explore_samples: Input should be greater than 0"),
    ],
)
def test_train_rejects_bad_input_with_a_clear_message(args, message):
    result = runner.invoke(app, ["train", *args], env={"COLUMNS": "300"})
    assert result.exit_code != 0
    assert message in " ".join(result.output.replace("│", " ").split())


def test_train_refuses_to_overwrite_an_existing_run_folder(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    result = runner.invoke(app, ["train", "--out", str(tmp_path)])
    assert result.exit_code != 0 and "--overwrite" in result.output
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"


def test_train_config_with_group_size_one_is_refused():
    from workers.trainer.grpo_trainer import TrainConfig

    with pytest.raises(ValueError, match="group_size"):
        TrainConfig(group_size=1)


def test_train_config_with_an_unknown_reward_lists_the_registered_ones():
    from workers.trainer.grpo_trainer import TrainConfig

    with pytest.raises(ValueError, match="minigeneval"):
        TrainConfig(reward="aesthetic_v9")


def test_train_prints_one_json_object_per_iteration(tmp_path, tiny_policy):
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "ckpt")
    result = runner.invoke(
        app,
        [
            "train",
            "--preset",
            "cpu_smoke",
            "--checkpoint",
            str(tmp_path / "ckpt"),
            "--json",
            "--out",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["iteration"] for r in lines] == [0, 1, 2]
    for key in ("reward_mean", "reward_std", "zero_std_ratio", "validation_score", "step_s"):
        assert key in lines[1]
    assert (tmp_path / "run" / "policy" / "policy.json").is_file()
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3


def test_train_writes_a_ledger_that_spotlight_ledger_reads(tmp_path, tiny_policy):
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "ckpt")
    run = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "train",
            "--preset",
            "cpu_smoke",
            "--checkpoint",
            str(tmp_path / "ckpt"),
            "--out",
            str(run),
            "--reserved-usd-per-hour",
            "3.6",
        ],
    )
    assert result.exit_code == 0, result.output
    db = str(run / "ledger.duckdb")
    curve = runner.invoke(app, ["ledger", "SELECT iteration, score FROM validation_curve", "--db", db, "--json"])
    assert curve.exit_code == 0, curve.output
    rows = [json.loads(line) for line in curve.stdout.splitlines() if line.startswith("{")]
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    cost = runner.invoke(app, ["ledger", "SELECT sum(usd_total) AS usd FROM cost_per_iteration", "--db", db, "--csv"])
    usd = float(cost.stdout.strip().splitlines()[-1])
    assert usd > 0  # 3.6 $/h for the seconds the iterations took
    steps = runner.invoke(app, ["ledger", "SELECT count(*) AS n FROM train_steps", "--db", db, "--csv"])
    assert steps.stdout.strip().splitlines()[-1] == "2"


def _payoff(run) -> list[dict]:
    """Each iteration's planner and explored prompts, as `spotlight ledger` reads them from the run's ledger."""
    sql = "SELECT iteration, planner, explored_prompts FROM exploration_payoff ORDER BY iteration"
    rows = runner.invoke(app, ["ledger", sql, "--db", str(run / "ledger.duckdb"), "--json"])
    assert rows.exit_code == 0, rows.output
    return [json.loads(line) for line in rows.stdout.splitlines() if line.startswith("{")]


def test_train_explores_on_a_sample_budget_and_the_ledger_shows_the_explored_plans(tmp_path, tiny_policy):
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "ckpt")
    run = tmp_path / "run"
    result = runner.invoke(
        app,
        [
            "train",
            "--preset",
            "cpu_smoke",
            "--checkpoint",
            str(tmp_path / "ckpt"),
            "--out",
            str(run),
            "--explore-samples",
            "16",
        ],
    )
    assert result.exit_code == 0, result.output
    payoff = _payoff(run)
    assert [(r["iteration"], r["planner"], r["explored_prompts"]) for r in payoff] == [
        (0, "default", 0),
        (1, "explore:m8-quarter_steps", 2),
    ]  # every arm untried: the cheapest first


def test_a_run_files_explore_section_is_how_the_run_explores(tmp_path, tiny_policy):
    """The seam from a user's run file to the exploration that runs: the file names a sample budget, one arm and a
    control prompt; every explored plan in the ledger uses that arm, and one of the two prompts keeps its default
    seeds (the preset's own arms would start at m8-quarter_steps on both)."""
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "ckpt")
    (tmp_path / "run.yaml").write_text(
        "explore:\n  explore_samples: 16\n  seed_multipliers: [4]\n  cache_levels: [half_steps]\n  control_prompts: 1\n"
    )
    run = tmp_path / "run"
    args = ["train", "--preset", "cpu_smoke", "--config", str(tmp_path / "run.yaml"), "--iterations", "3"]
    result = runner.invoke(app, [*args, "--checkpoint", str(tmp_path / "ckpt"), "--out", str(run)])
    assert result.exit_code == 0, result.output
    payoff = _payoff(run)
    explored = [(r["planner"], r["explored_prompts"]) for r in payoff if r["iteration"] > 0]
    # cpu_smoke: 2 prompts x G = 4; m16 is 4 x G.
    assert explored and set(explored) == {("explore:m16-half_steps", 1)}, payoff


def test_train_with_the_nft_objective_writes_its_steps_to_the_ledger(tmp_path, tiny_policy):
    """NFT updates have no PPO clip: the ledger's clip_fraction is NULL, not a crash (it was a KeyError)."""
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "ckpt")
    run = tmp_path / "run"
    # jpeg_compressibility varies within every group (MiniGenEval scores this random policy's images all 0).
    result = runner.invoke(
        app,
        [
            "train",
            "--preset",
            "cpu_tiny",
            "--iterations",
            "1",
            "--checkpoint",
            str(tmp_path / "ckpt"),
            "--out",
            str(run),
            "--reward",
            "jpeg_compressibility",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = runner.invoke(
        app,
        [
            "ledger",
            "SELECT iteration, clip_fraction, grad_norm FROM train_steps",
            "--db",
            str(run / "ledger.duckdb"),
            "--json",
        ],
    )
    steps = [json.loads(line) for line in rows.stdout.splitlines() if line.startswith("{")]
    assert len(steps) == 1 and steps[0]["clip_fraction"] is None and steps[0]["grad_norm"] > 0


def test_bench_recipe_reports_the_held_out_gain_of_every_seed(tmp_path, tiny_policy):
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "ckpt")
    result = runner.invoke(
        app,
        [
            "bench",
            "recipe",
            "--preset",
            "cpu_smoke",
            "--seed",
            "0",
            "--seed",
            "1",
            "--checkpoint",
            str(tmp_path / "ckpt"),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["num_seeds"] == 2 and [r["seed"] for r in figures["runs"]] == [0, 1]
    for run in figures["runs"]:
        assert [p["iteration"] for p in run["validation_curve"]] == [0, 1, 2]
        assert run["gain"] == pytest.approx(run["final_score"] - run["start_score"])
    assert figures["gain_min"] <= figures["gain_mean"]


def test_pretrain_init_must_name_a_policy_folder(tmp_path):
    result = runner.invoke(app, ["pretrain", "--out", str(tmp_path / "out"), "--init", str(tmp_path)])
    text = " ".join(result.output.replace("│", " ").split())  # rich wraps the message in a box
    assert result.exit_code != 0 and "holds no policy" in text
