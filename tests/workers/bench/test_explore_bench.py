"""`spotlight bench exploration` at its smallest size: the strategies compared on equal terms, budgets kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import REPO_ROOT

ROOT = REPO_ROOT


def _quick(tmp_path, *extra: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        str(Path(sys.executable).parent / "spotlight"),
        "bench",
        "exploration",
        "--quick",
        "--json",
        "--out",
        str(tmp_path / "records"),
        *extra,
    ]
    out = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=280)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.mark.nightly
@pytest.mark.slow
def test_quick_learning_bench_compares_the_strategies_on_equal_terms(tmp_path) -> None:
    figures = _quick(
        tmp_path, "--timing-iterations", "0", "--jobs", "2"
    )  # the pipeline timing runs: the nightly test below
    learning, runs = figures["learning"], {r["strategy"]: r for r in figures["learning_runs"]}
    assert set(learning["strategies"]) == set(runs) == {"random", "explore", "wider_draw"}
    # Every strategy starts from the same weights, validated on the same held-out prompts and seeds.
    assert len({r["curve"][0]["score"] for r in runs.values()}) == 1 == len({len(r["curve"]) for r in runs.values()})
    # Iteration 0 has no plan yet: explore trains on exactly random's batch (same seeds, same weights).
    same = lambda row: {k: v for k, v in row.items() if not k.endswith("_s")}  # noqa: E731 (seconds differ, nothing else)
    assert same(runs["explore"]["iterations"][0]) == same(runs["random"]["iterations"][0])
    # Iteration 1 trains on seeds explored on v(0), within the budget of 16 samples per iteration.
    first = runs["explore"]["exploration"][0]
    assert first["arm"] in figures["arms"] and 0 < first["samples_used"] <= 16.0 and first["explored_prompts"] == 2
    assert same(runs["explore"]["iterations"][1]) != same(runs["random"]["iterations"][1])
    # No pipeline timing runs: seconds per iteration come from the runs' own ledgers as a work model, so explore
    # and random (the same samples on the critical path) cost the same and the speed-up is the iterations ratio.
    timing = figures["timing"]
    assert timing["random"]["source"].startswith("work model") and timing["explore"]["explore_samples"] > 0
    assert timing["explore"]["critical_s_per_iteration"] == timing["random"]["critical_s_per_iteration"]
    assert timing["wider_draw"]["critical_s_per_iteration"] > timing["random"]["critical_s_per_iteration"]
    ratio = learning["targets"][f"{figures['target_gain']:+.2f}"]["random_over_explore"]["ratio"]
    assert figures["time_to_target_speedup"] == (None if ratio is None else pytest.approx(ratio, abs=1e-3))
    for reward, selection in figures["static"]["selection"].items():  # picking the most contrast never loses any
        oracle, random_ = selection["full_sampler_same_weights"], selection["random"]
        assert (
            oracle["reward_std"] >= random_["reward_std"] and oracle["zero_std_ratio"] <= random_["zero_std_ratio"]
        ), reward
    assert sorted(p.name for p in (tmp_path / "records").iterdir()) == [
        "explore-s0.json",
        "random-s0.json",
        "wider_draw-s0.json",
    ]  # each learning run's record is kept


@pytest.mark.nightly
def test_quick_bench_with_timing_reports_the_critical_path_of_each_strategy(tmp_path) -> None:
    figures = _quick(tmp_path, "--jobs", "2")
    assert set(figures["timing"]) == {"random", "explore", "wider_draw"}
    assert all(t["critical_s_per_iteration"] > 0 for t in figures["timing"].values())
    assert 0 <= figures["timing"]["explore"]["exploration_overhead_pct"] < 100
    # The headline is the iterations ratio (random over explore) times the seconds-per-iteration ratio: undefined
    # (None) when random never reaches the target, while the interval may still bound it from below.
    interval, speedup = figures["time_to_target_speedup_interval"], figures["time_to_target_speedup"]
    if interval is not None:
        assert interval["seconds_ratio"] > 0
        if interval["iterations_ratio"] is None:
            assert speedup is None
        else:
            assert speedup == pytest.approx(interval["iterations_ratio"] * interval["seconds_ratio"], abs=1e-3)


def test_a_learning_run_reuses_its_record_and_redoes_a_stale_one(tmp_path, tiny_policy) -> None:
    import dataclasses

    from workers.bench.exploration_learning import LearningRun, learning_run
    from workers.explore.state import ExploreConfig
    from workers.model.tiny_policy import save_policy
    from workers.trainer.presets import get_preset

    save_policy(tiny_policy, tmp_path / "tiny")
    config = dataclasses.replace(get_preset("cpu_smoke"), iterations=1)
    spec = LearningRun("explore", 0, config, ExploreConfig(cache_levels=("half_steps",)), 16.0, str(tmp_path / "tiny"))
    (tmp_path / "out").mkdir()
    kept = {"fingerprint": spec.fingerprint(), "curve": "kept as written"}
    (tmp_path / "out" / "explore-s0.json").write_text(json.dumps(kept))
    assert learning_run(spec, tmp_path / "out") == kept  # this run's record: nothing is trained again
    other = dataclasses.replace(spec, explore_samples=9.0)  # another budget: the record is stale
    record = learning_run(other, tmp_path / "out")
    assert record["fingerprint"] == other.fingerprint() != spec.fingerprint()
    assert [p["version"] for p in record["curve"]] == [0, 1] and record["exploration"][0]["arm"] == "m8-half_steps"
    assert json.loads((tmp_path / "out" / "explore-s0.json").read_text()) == record


def test_a_record_is_reused_from_another_clone_and_redone_for_another_base_or_cpu(
    tmp_path, tiny_policy, monkeypatch
) -> None:
    """A run's fingerprint names its prompts file and base by their bytes: a second clone (or a copied base) finds
    the first one's records; a base with other weights, or another processor, does not."""
    import dataclasses
    import shutil

    import torch

    from workers.bench import exploration_learning
    from workers.bench.exploration_learning import LearningRun
    from workers.explore.state import ExploreConfig
    from workers.model.tiny_policy import save_policy
    from workers.rollout.kernels import cpu_identity
    from workers.task.prompt_file import PromptSource
    from workers.trainer.presets import get_preset

    def spec(clone: Path, base: Path) -> LearningRun:
        prompts = PromptSource.from_file(clone / "prompts.jsonl", heldout_fraction=0.1)
        config = dataclasses.replace(get_preset("cpu_tiny_ocr"), prompts=prompts)
        return LearningRun("explore", 0, config, ExploreConfig(), 64.0, str(base))

    rows = "".join(json.dumps({"prompt": f"text {i}"}) + "\n" for i in range(60))
    for clone in ("a", "b"):
        (tmp_path / clone).mkdir()
        (tmp_path / clone / "prompts.jsonl").write_text(rows)
    save_policy(tiny_policy, tmp_path / "a" / "base")
    shutil.copytree(tmp_path / "a" / "base", tmp_path / "b" / "base")
    first = spec(tmp_path / "a", tmp_path / "a" / "base").fingerprint()
    assert spec(tmp_path / "b", tmp_path / "b" / "base").fingerprint() == first
    with torch.no_grad():
        next(tiny_policy.parameters()).add_(1e-3)
    save_policy(tiny_policy, tmp_path / "b" / "base")
    assert spec(tmp_path / "b", tmp_path / "b" / "base").fingerprint() != first
    (tmp_path / "b" / "prompts.jsonl").write_text(rows + json.dumps({"prompt": "one more"}) + "\n")
    assert spec(tmp_path / "b", tmp_path / "a" / "base").fingerprint() != first
    here = cpu_identity()
    monkeypatch.setattr(exploration_learning, "cpu_identity", lambda: {**here, "processor": "another model"})
    assert spec(tmp_path / "a", tmp_path / "a" / "base").fingerprint() != first


def test_bad_bench_settings_fail_before_any_compute() -> None:
    spotlight = str(Path(sys.executable).parent / "spotlight")
    out = subprocess.run(
        [spotlight, "bench", "exploration", "--seed", "1", "--seed", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "seeds must be distinct" in out.stderr
    out = subprocess.run(
        [spotlight, "bench", "exploration", "--explore-samples", "0"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0 and "explore_samples must be > 0" in out.stderr


def test_the_wide_random_arm_trains_groups_twice_as_large_and_a_shared_base_reading_is_reused(
    tmp_path, tiny_policy
) -> None:
    import dataclasses

    from workers.bench.exploration_learning import LearningRun, learning_run, with_base_reading
    from workers.explore.state import ExploreConfig
    from workers.model.tiny_policy import save_policy
    from workers.trainer.presets import get_preset

    save_policy(tiny_policy, tmp_path / "tiny")
    config = dataclasses.replace(get_preset("cpu_smoke"), iterations=1)  # 2 prompts x G = 4
    base = LearningRun("random", 0, config, ExploreConfig(), 16.0, str(tmp_path / "tiny"))
    wide = dataclasses.replace(base, strategy="random_wide", reads_base=False)
    narrow, doubled = learning_run(base), learning_run(wide)
    assert [row["rollout_samples"] for row in narrow["iterations"]] == [8]
    assert [row["rollout_samples"] for row in doubled["iterations"]] == [16]  # R_2G: groups of 2G, all trained
    assert all(row["update_mass"] >= 0 and row["train_s"] > 0 for row in doubled["iterations"])
    assert [p["version"] for p in doubled["curve"]] == [1]  # it left version 0 to the run that reads it
    merged = with_base_reading([narrow, doubled])
    assert merged[1]["curve"][0] == narrow["curve"][0] and merged[1]["curve"][1:] == doubled["curve"]
    assert wide.fingerprint() != dataclasses.replace(wide, reads_base=True).fingerprint()


def test_seconds_per_iteration_are_work_pooled_over_the_runs_so_a_doubled_group_costs_twice() -> None:
    from workers.bench.exploration_summary import timing_from_learning

    def record(strategy: str, samples: int, load: float, explored: float = 0.0) -> dict:
        rows = [
            {
                "iteration": k,
                "sync_s": 0.0,
                "rollout_s": load * samples,
                "train_s": 3 * load * samples,
                "rollout_samples": samples,
            }
            for k in range(3)
        ]
        return {
            "strategy": strategy,
            "iterations": rows,
            "exploration": [{"samples_used": explored}] if explored else [],
        }

    # The wide arm ran on a machine twice as loaded: its wall seconds say 4x, its work says 2x.
    timing = timing_from_learning(
        [record("random", 8, 1.0), record("explore", 8, 1.0, explored=16.0), record("random_wide", 16, 2.0)]
    )
    assert timing["random_wide"]["critical_s_per_iteration"] == pytest.approx(
        2 * timing["random"]["critical_s_per_iteration"]
    )
    assert timing["random_wide"]["wall_critical_s"]["median"] == pytest.approx(4 * 32.0)
    assert timing["explore"]["critical_s_per_iteration"] == timing["random"]["critical_s_per_iteration"]
    assert timing["explore"]["total_s_per_iteration"] > timing["explore"]["critical_s_per_iteration"]


def test_a_run_built_in_code_validates_on_its_prompt_files_held_out_side_as_spotlight_train_does(tmp_path) -> None:
    """The benches build their runs in code (RunContext.local, no RunSettings): a MiniOCR run must validate on the
    prompts file's held-out strings with the OCR reward (MiniGenEval's prompts are words its policy cannot read),
    and a MiniGenEval run as before."""
    from workers.coordinator.context import RunContext
    from workers.coordinator.run_settings import RunSettings
    from workers.task.validation import resolve_validation
    from workers.trainer.presets import get_preset, preset_config

    def plan(preset: str):
        ctx = RunContext.local(tmp_path / preset, "x", "bench", get_preset(preset), report=False)
        return resolve_validation(ctx.validation, ctx.train.reward, model=False)

    ocr, geneval = plan("cpu_tiny_ocr_spot"), plan("cpu_tiny")
    heldout = get_preset("cpu_tiny_ocr_spot").prompts.table().heldout
    assert ocr.reward == "ocr" and not ocr.detector and ocr.prompts == tuple(heldout) and len(heldout) == 53
    train = RunSettings.of(preset_config("cpu_tiny_ocr_spot")).validation  # what `spotlight train` validates on
    assert ocr == resolve_validation(train, "ocr", model=False)
    assert geneval.detector and len(geneval.prompts) == 64


@pytest.mark.nightly
def test_a_learning_run_on_miniocr_reads_its_held_out_strings_as_spotlight_train_does(tmp_path) -> None:
    """The bench builds its runs in code (no RunSettings): they must still validate on the prompts file's held-out
    strings with the OCR reward, not on MiniGenEval's prompts, which the MiniOCR policy cannot read."""
    import dataclasses

    from workers.bench.exploration_learning import LearningRun, learning_run
    from workers.explore.state import ExploreConfig
    from workers.model.pretrain import evaluate_base
    from workers.model.tiny_policy import SHIPPED_OCR_BASE, load_policy
    from workers.trainer.presets import get_preset

    config = dataclasses.replace(get_preset("cpu_tiny_ocr_spot"), iterations=1, prompts_per_iteration=2, group_size=4)
    record = learning_run(LearningRun("random", 0, config, ExploreConfig(), 16.0, str(SHIPPED_OCR_BASE)))
    assert [p["version"] for p in record["curve"]] == [0, 1]
    base = evaluate_base(load_policy(SHIPPED_OCR_BASE), "miniocr")  # what `spotlight pretrain --json` reads
    assert record["curve"][0]["score"] == pytest.approx(base.score, abs=1e-6) and base.score > 0.1


def test_a_runs_progress_line_says_when_its_first_reading_is_not_the_base() -> None:
    from workers.bench.exploration import _line

    def record(versions: list[int]) -> dict:
        curve = [{"version": v, "score": 0.3 + 0.01 * v} for v in versions]
        return {"strategy": "explore", "seed": 1, "curve": curve, "wall_s": 90.0}

    assert _line(record([0, 5, 10])).endswith("held-out 0.300 -> 0.400 in 10 iterations (1.5 min)")
    shared = _line(record([5, 10]))  # --shared-base-reading: another run read version 0
    assert "held-out 0.350 (version 5; the base is read by another run) -> 0.400" in shared


@pytest.mark.parametrize(
    ("preset", "flags"),
    [
        ("cpu_tiny_ocr_spot", []),  # the MiniOCR pilot's and confirmation's command (BENCHMARKS.md)
        ("cpu_tiny_lowpass", ["--seed-multiplier", "4", "--level", "half_steps", "--explore-samples", "64"]),
    ],
)
def test_the_explore_arm_a_bench_measured_is_how_spotlight_run_explores_that_preset(
    monkeypatch, preset: str, flags: list[str]
) -> None:
    """What the exploration bench measured for a preset's E_G arm (its documented command, through the CLI) is what
    `spotlight run --preset` then runs: the same arms, seeds kept per group, control prompts, tau floor and budget of
    samples per iteration. MiniOCR's preset explored as a pre-filter with a control prompt while its bench measured
    explored seeds in place of random ones."""
    from typer.testing import CliRunner

    import workers.bench.exploration as exploration
    from pipelines.cli import app
    from workers.coordinator.run_settings import RunSettings
    from workers.trainer.presets import preset_config

    measured = []
    monkeypatch.setattr(exploration, "run_exploration_bench", lambda bench, *a, **k: measured.append(bench) or {})
    done = CliRunner().invoke(
        app, ["bench", "exploration", "--json", "--preset", preset, "--strategy", "explore", *flags]
    )
    assert done.exit_code == 0, done.output
    bench, run = measured[0].explore_config(), RunSettings.of(preset_config(preset)).explore  # what the run reads
    fields = ("seed_multipliers", "cache_levels", "keep_factors", "control_prompts")
    assert {f: getattr(bench, f) for f in fields} == {f: getattr(run, f) for f in fields}
    assert bench.bandit.min_arm_tau == run.bandit.min_arm_tau
    assert measured[0].explore_samples == run.budget_samples  # a request budget of the same samples per iteration
    assert preset_config(preset).explore.explore is True
    assert "explores otherwise" not in done.output


def test_a_bench_of_a_preset_that_explores_otherwise_says_so_before_any_compute(monkeypatch) -> None:
    """The demo's preset explores as a pre-filter with a control prompt and a tau floor; the bench's explore strategy
    defaults to neither. Before it starts, the bench says how `spotlight run` explores and the flags that measure it,
    and with those flags it measures the run's exploration and says nothing."""
    from typer.testing import CliRunner

    import workers.bench.exploration as exploration
    from pipelines.cli import app

    started = []
    monkeypatch.setattr(exploration, "run_exploration_bench", lambda bench, *a, **k: started.append(bench) or {})
    done = CliRunner().invoke(app, ["bench", "exploration", "--json", "--preset", "cpu_tiny_spot"])
    assert done.exit_code == 0, done.output
    note = done.output.splitlines()[0]
    assert note.startswith("note: `spotlight run --preset cpu_tiny_spot` explores otherwise")
    assert "--keep-factor 1.5 (this bench: 1)" in note and "--control-prompts 1" in note and "--min-arm-tau 0.2" in note
    flags = ["--keep-factor", "1.5", "--control-prompts", "1", "--min-arm-tau", "0.2"]
    done = CliRunner().invoke(app, ["bench", "exploration", "--json", "--preset", "cpu_tiny_spot", *flags])
    assert done.exit_code == 0 and "explores otherwise" not in done.output
    assert started[1].differs_from_run() == {} and started[1].explore_config().keep_factors == (1.5,)
