"""`--advantage per-component`: the trainer and the pipeline normalise each multi-reward component within its
group before weighting, from the components the rollouts carry."""

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from pipelines.cli import app
from workers.algo.advantages import component_advantages
from workers.algo.grpo import GRPOConfig
from workers.algo.sampler import SamplerConfig
from workers.trainer.grpo_trainer import GRPOTrainer, TrainConfig, keep_max_variance

MULTI = "multi:jpeg_compressibility=1.0,minigeneval=0.5"
WEIGHTS = {"jpeg_compressibility": 1.0, "minigeneval": 0.5}


def _config(**fields):
    return TrainConfig(
        prompts_per_iteration=2,
        group_size=4,
        rollouts_per_prompt=6,
        reward=MULTI,
        sampler=SamplerConfig(num_steps=4, noise_level=0.0),
        grpo=GRPOConfig(objective="nft", advantage="per-component", num_minibatches=1, lr=1e-3),
        **fields,
    )


def test_per_component_advantages_are_refused_for_a_single_reward_before_any_compute():
    with pytest.raises(ValueError, match="needs a multi: reward"):
        TrainConfig(reward="jpeg_compressibility", grpo=GRPOConfig(advantage="per-component"))
    result = CliRunner().invoke(app, ["train", "--advantage", "per-component", "--iterations", "1"])
    assert result.exit_code != 0 and "needs a multi: reward" in result.output
    result = CliRunner().invoke(app, ["train", "--advantage", "per-prompt"], env={"COLUMNS": "300"})
    said = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code != 0 and "'per-prompt' is not one of 'total', 'per-component'" in said


@pytest.mark.parametrize("command", ["train", "run"])
def test_both_commands_refuse_per_component_advantages_of_a_single_reward(tmp_path, command):
    where = ["--out", str(tmp_path / "r")] if command == "train" else ["--run-dir", str(tmp_path / "r")]
    result = CliRunner().invoke(app, [command, "--preset", "cpu_smoke", *where, "--advantage", "per-component"])
    assert result.exit_code != 0 and "needs a multi: reward" in " ".join(result.output.replace("│", " ").split())
    assert not (tmp_path / "r" / "ledger.duckdb").exists()


def test_spotlight_run_keeps_the_advantage_in_its_config_and_its_train_config(tmp_path):
    from pipelines.deploy import build_resources
    from pipelines.run import resolve_run, save_run_config

    flags = {"preset": "cpu_smoke", "reward": MULTI, "advantage": "per-component"}
    save_run_config(resolve_run(tmp_path, resume=False, flags=flags).config)
    config = resolve_run(tmp_path, resume=True, flags={}).config
    assert build_resources(config)["run_config"].train.grpo.advantage == "per-component"


def test_the_trainer_normalises_each_component_within_its_group_and_trains_on_it(tiny_policy):
    trainer = GRPOTrainer(tiny_policy, _config())
    drawn = trainer.collect(0, keep_all=True)
    parts = {name: torch.as_tensor(v) for name, v in drawn.reward_components.items()}
    expected = component_advantages(parts, WEIGHTS, drawn.group_ids)
    assert torch.equal(drawn.advantages, expected)
    assert not torch.allclose(drawn.advantages, GRPOConfig().advantages(drawn.rewards, drawn.group_ids), atol=1e-3)

    kept = keep_max_variance(drawn, 4, trainer.config.grpo, trainer.config.reward)
    pairs = list(zip(drawn.group_ids.tolist(), drawn.trajectory.seeds, strict=True))
    index = torch.tensor([pairs.index(p) for p in zip(kept.group_ids.tolist(), kept.trajectory.seeds, strict=True)])
    kept_parts = {name: v[index] for name, v in parts.items()}
    assert torch.equal(kept.advantages, component_advantages(kept_parts, WEIGHTS, kept.group_ids))

    before = [p.detach().clone() for p in tiny_policy.parameters()]
    stats = trainer.update(kept)
    assert np.isfinite(stats["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, tiny_policy.parameters(), strict=True))


def test_the_pipeline_rebuilds_the_same_advantages_from_the_stored_components(tmp_store, tiny_policy):
    """The train phase reads the batch back from committed results: the components stored with each result give
    the advantages the in-process trainer computed, after the same down-sampling of a wider draw."""
    from workers.coordinator.rollout import collect_in_process, iteration_requests, load_batch
    from workers.explore.seed_plan import default_seed_plan
    from workers.trainer.checkpoint import save_checkpoint

    config = _config()
    save_checkpoint(tmp_store, "demo", 2, tiny_policy, GRPOTrainer(tiny_policy, config).optimizer)
    requests = iteration_requests(config, "demo", 2, weights_version=2, plan=default_seed_plan(config, 2))
    assert collect_in_process(tmp_store, "demo", config, 2, requests) == len(requests)
    loaded = load_batch(tmp_store, "demo", config, 2, requests)
    direct = GRPOTrainer(tiny_policy, config).collect(2)
    assert loaded.trajectory.seeds == direct.trajectory.seeds
    assert torch.equal(loaded.advantages, direct.advantages)
    assert not torch.equal(direct.advantages, GRPOConfig().advantages(direct.rewards, direct.group_ids))


@pytest.mark.slow
def test_spotlight_train_takes_the_option(tmp_path, tiny_policy):
    """`spotlight train --advantage per-component` runs end to end on a multi-reward (two iterations)."""
    from workers.model.tiny_policy import save_policy

    save_policy(tiny_policy, tmp_path / "ckpt")
    args = ["train", "--preset", "cpu_smoke", "--checkpoint", str(tmp_path / "ckpt"), "--reward", MULTI]
    result = CliRunner().invoke(app, [*args, "--advantage", "per-component", "--json", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert [r["iteration"] for r in lines] == [0, 1, 2]
    assert all(f"reward/{name}" in lines[1] for name in WEIGHTS)
