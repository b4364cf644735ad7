"""`spotlight train --config run.yaml`: the file's options are the command's defaults, flags given win, and a bad
file or value fails before any compute."""

from typer.testing import CliRunner

from pipelines.cli import app


def _train(tmp_path, yaml_text: str, *args):
    path = tmp_path / "run.yaml"
    path.write_text(yaml_text)
    return CliRunner().invoke(app, ["train", "--config", str(path), *args])


def _said(done) -> str:
    """The command's output as one line of words (rich boxes and wraps its errors)."""
    return " ".join(done.output.replace("│", " ").split())


def test_the_files_options_reach_the_run_config(tmp_path):
    done = _train(tmp_path, "preset: cpu_smoke\nrollout-batch: 0\n")
    assert done.exit_code != 0 and "--rollout-batch must be >= 1, got 0" in _said(done)


def test_a_flag_on_the_command_line_wins_over_the_file(tmp_path):
    # The file's invalid micro_batch is replaced by the flag, so the first error is the next check's (the price).
    done = _train(tmp_path, "preset: cpu_smoke\nmicro_batch: 0\n", "--micro-batch", "2", "--usd-per-hour", "-1")
    assert done.exit_code != 0
    assert "usd-per-hour must be >= 0" in done.output and "micro_batch" not in done.output


def test_batch_shape_flags_are_checked_together_before_any_compute(tmp_path):
    done = _train(tmp_path, "preset: cpu_smoke\ngroup-size: 4\nprompts-per-iteration: 1\n", "--minibatches", "5")
    assert done.exit_code != 0 and "num_minibatches=5 exceeds the samples per iteration" in done.output


def test_an_unknown_key_names_the_options_this_command_takes(tmp_path):
    done = _train(tmp_path, "rollout-batchh: 8\n")
    assert done.exit_code != 0
    assert "rollout-batchh" in done.output and "rollout-batch" in done.output.replace("rollout-batchh", "")


def test_spotlight_run_reads_the_same_file_and_refuses_a_bad_batch_shape_before_writing(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("preset: cpu_smoke\nmicro-batch: 0\n")
    run_dir = tmp_path / "run"
    done = CliRunner().invoke(app, ["run", "--run-dir", str(run_dir), "--config", str(path)])
    assert done.exit_code != 0 and "--micro-batch must be >= 1, got 0" in _said(done)
    done = CliRunner().invoke(
        app, ["run", "--run-dir", str(run_dir), "--config", str(path), "--micro-batch", "3", "--minibatches", "99"]
    )
    assert done.exit_code != 0 and "num_minibatches=99 exceeds" in done.output
    assert not run_dir.exists(), "a refused run must write nothing"
