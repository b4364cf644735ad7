"""`spotlight launch --dry-run` and what launch refuses: the tasks it would submit, as SkyPilot parses and serves them.

SkyPilot's API is replaced by a recording fake (no cloud here); the tasks themselves are
real `sky.Task` objects parsed from sky/*.yaml, and the dry run is checked against them.
"""

from __future__ import annotations

import pytest

from sky import exceptions as sky_exceptions
from tests.paths import REPO_ROOT
from tests.pipelines.sky_fakes import PASSWORD, SECRETS, dry_run_output, launch_plan, served_task
from tests.pipelines.sky_fakes import invoke as _invoke


def _yaml_task(name: str):
    import sky

    return sky.Task.from_yaml(str(REPO_ROOT / "sky" / name))


def _yaml_secrets(name: str) -> list[str]:
    """The secret names the YAML declares (SkyPilot's parser drops those whose value is null)."""
    import yaml

    return list(yaml.safe_load((REPO_ROOT / "sky" / name).read_text())["secrets"])


PLANS = {
    "default": ((), {}),
    "one_gpu": ((), {"gpus": ("A100",)}),
    "sp_nodes": ((), {"sp_degree": "auto", "gpus_per_node": 4}),
    "model": (
        ("--model", "/models/Qwen-Image", "--preset", "qwen_image_lora", "--reward", "http://rewards:8200")
        + ("--prompts", "/data/prompts.jsonl"),
        {"model_source": "s3://weights/Qwen-Image"},
    ),
}


@pytest.mark.parametrize("plan", PLANS)
def test_every_task_launch_submits_passes_skypilots_yaml_round_trip_and_secret_resolution(plan, tmp_path) -> None:
    """What SkyPilot's API server does with each task before provisioning: load the client's YAML dump, then
    resolve secrets (a declared secret with no value is refused there: "No value available for secret(s)"). The
    run's config file is a file mount of every task, at the path its run line reads. The reward token reaches every
    node; the env-cache signing key the reserved node only, its verify key every node; each worker job has its own
    ACL user and that user's password."""
    from urllib.parse import urlsplit

    from resources.cloud import plan_tasks, ship_run_config, with_env_signing, with_run_tls
    from resources.cloud.env_pin import make_env_signing
    from resources.queue.redis_acl import worker_password
    from resources.queue.redis_tls import make_run_tls

    tls, pin, token = make_run_tls(), make_env_signing(), {"SPOTLIGHT_REWARD_TOKEN": "reward-tok-3"}
    secrets = with_env_signing(with_run_tls({**SECRETS, **token}, tls), pin)
    flags, cloud = PLANS[plan]
    launch = launch_plan(*flags, spot_workers=2, **cloud)
    shipped = ship_run_config(launch, tmp_path)
    tasks = plan_tasks(launch, secrets, shipped, "rediss://w@10.0.0.7:6379/0")
    assert len(tasks) == 3
    expected = [
        {
            **SECRETS,
            **token,
            "SPOTLIGHT_REDIS_TLS_CERT": tls.b64("cert_pem"),
            "SPOTLIGHT_REDIS_TLS_KEY": tls.b64("key_pem"),
            "SPOTLIGHT_ENV_SIGNING_KEY": pin.b64("signing_pem"),
        }
    ]
    users = [urlsplit(task.envs["SPOTLIGHT_QUEUE"]).username for task in tasks[1:]]
    assert len(set(users)) == 2 and all(u.startswith("spotlight-w") for u in users)  # one ACL user per worker job
    password = SECRETS["SPOTLIGHT_REDIS_PASSWORD"]
    expected += [{**SECRETS, **token, "SPOTLIGHT_REDIS_PASSWORD": worker_password(password, u)} for u in users]
    for task, secrets_of_task in zip(tasks, expected, strict=True):
        served = served_task(task)
        assert {k: v.get_secret_value() for k, v in served.secrets.items()} == secrets_of_task
        assert served.envs["SPOTLIGHT_REDIS_RUN_CA"] == tls.b64("ca_pem")
        assert served.envs["SPOTLIGHT_ENV_VERIFY_KEY"] == pin.b64("verify_pem")
        assert not served.managed_secret_refs and served.envs == task.envs and served.name == task.name
        assert {str(r) for r in served.resources} == {str(r) for r in task.resources}
        assert served.file_mounts["~/" + served.envs["RUN_CONFIG"]] == str(shipped)
        assert '"$HOME/$RUN_CONFIG"' in served.run  # the run line hands that file to spotlight run / the worker
    with pytest.raises(RuntimeError, match="No value available for secret"):  # a dry run's tasks: nothing to resolve
        served_task(plan_tasks(launch_plan(*flags, **cloud), {}, shipped)[0])


def test_dry_run_prints_the_reserved_task_and_one_spot_task_per_worker_as_skypilot_parses_them(fake_sky) -> None:
    from resources.cloud.tasks import CONTROLLER_FALLBACK
    from resources.prices import PriceTable

    result = _invoke("launch", "--spot-workers", "3", "--store", "s3://bucket/run", "--max-usd", "200", "--dry-run")
    assert result.exit_code == 0, result.output
    run_config, reserved, workers = dry_run_output(result.output)
    assert not fake_sky.calls and PASSWORD not in result.output and "s3cr3t" not in result.output
    yaml_reserved, yaml_spot = _yaml_task("reserved.yaml"), _yaml_task("spot_workers.yaml")
    (r,) = yaml_reserved.resources
    assert reserved["resources"] == [
        {
            "accelerators": dict(r.accelerators),
            "use_spot": False,
            "job_recovery": None,
            "ports": [],  # the Redis port is opened to no one: workers use the node's private address
            "cloud": None,
        }
    ]
    ca = reserved["envs"]["SPOTLIGHT_REDIS_RUN_CA"]  # a throwaway CA: a dry run keeps nothing
    assert __import__("base64").b64decode(ca).startswith(b"-----BEGIN CERTIFICATE-----")
    node_usd = PriceTable().usd_per_hour(next(iter(r.accelerators)), spot=False)[0] + CONTROLLER_FALLBACK[0]
    assert reserved["envs"] == {
        **yaml_reserved.envs,
        "SPOTLIGHT_STORE": "s3://bucket/run",
        "MAX_USD": "200",
        "SPOTLIGHT_REDIS_RUN_CA": ca,
        "ENV_CACHE_DIR": "/spotlight-env-cache",  # sky/setup.sh restores the venv from the store's env-cache/
        "SPOTLIGHT_ENV_VERIFY_KEY": reserved["envs"]["SPOTLIGHT_ENV_VERIFY_KEY"],  # ... if this key verifies it
        "RUN_CONFIG_FILE": reserved["file_mounts"]["~/.spotlight/run_config.yaml"],  # the YAML's file_mounts source
    }
    assert __import__("base64").b64decode(reserved["envs"]["SPOTLIGHT_ENV_VERIFY_KEY"]).startswith(b"-----BEGIN PUB")
    # The node's price is the run's, in the file it runs: its GPUs and the jobs controller, not the tree's $0.10.
    assert run_config["deployment"]["reserved_usd_per_hour"] == round(node_usd, 6)
    for task in (reserved, *workers):
        assert task["storage_mounts"] == {"/spotlight-env-cache": "s3://bucket/run/env-cache (MOUNT)"}
    assert all(w["envs"]["SPOTLIGHT_REDIS_RUN_CA"] == ca for w in workers)
    unset = {"SPOTLIGHT_REWARD_TOKEN": None}  # declared empty: this run has no remote reward
    assert reserved["secrets"] == {**{name: "***" for name in _yaml_secrets("reserved.yaml")}, **unset}
    assert [w["name"] for w in workers] == [f"spotlight-reserved-rollout-{i}" for i in (1, 2, 3)]
    for w in workers:  # no --gpu: the YAML's any_of, every option spot with the YAML's job recovery
        assert w["any_of"] and {next(iter(r["accelerators"])) for r in w["resources"]} == {
            next(iter(r.accelerators)) for r in yaml_spot.resources
        }
        assert all(
            r["use_spot"] and r["job_recovery"] == next(iter(yaml_spot.resources)).job_recovery for r in w["resources"]
        )
        assert w["envs"]["SPOTLIGHT_STORE"] == "s3://bucket/run" and w["secrets"] == {
            **{n: "***" for n in _yaml_secrets("spot_workers.yaml")},
            **unset,
        }
        dearest = max(PriceTable().usd_per_hour(next(iter(r.accelerators)), spot=True)[0] for r in yaml_spot.resources)
        assert float(w["envs"]["USD_PER_HOUR"]) == pytest.approx(dearest)  # not the YAML's flat one-GPU figure


def test_dry_run_with_one_gpu_pins_the_workers_to_it_and_prices_them_from_the_table(fake_sky) -> None:
    from resources.prices import PriceTable

    result = _invoke("launch", "--spot-workers", "1", "--gpu", "A100", "--store", "s3://b/p", "--dry-run")
    (worker,) = dry_run_output(result.output)[2]
    assert [r["accelerators"] for r in worker["resources"]] == [{"A100": 1}] and not worker["any_of"]
    assert worker["resources"][0]["job_recovery"]["recover_on_exit_codes"] == [75]
    assert float(worker["envs"]["USD_PER_HOUR"]) == pytest.approx(PriceTable().usd_per_hour("A100", spot=True)[0])


def test_dry_run_with_a_model_ships_it_in_the_run_config_and_mounts_its_bucket_at_that_path(fake_sky, tmp_path) -> None:
    import sky
    from resources.cloud import plan_tasks, ship_run_config

    model, source = "/models/Qwen-Image", "s3://weights/models/Qwen-Image"
    result = _invoke(
        *("launch", "--spot-workers", "2", "--store", "s3://b/p", "--preset", "qwen_image_lora", "--model", model),
        *("--model-source", source, "--reward", "http://rewards:8200", "--prompts", "/data/prompts.jsonl"),
        "--dry-run",
    )
    assert result.exit_code == 0, result.output
    run_config, reserved, workers = dry_run_output(result.output)
    assert (run_config["preset"], run_config["model"]["model"]) == ("qwen_image_lora", model)
    assert (run_config["train"]["reward"], run_config["train"]["prompts"]) == (
        "http://rewards:8200",
        "/data/prompts.jsonl",
    )
    assert run_config["workers"]["local_workers"] == 0  # the node's trainer holds the GPU: no workers beside it
    for task in (reserved, *workers):  # the run's settings travel in the file, never as variables
        assert not {"MODEL", "PRESET", "REWARD", "PROMPTS", "LOCAL_WORKERS"} & set(task["envs"])
        assert task["file_mounts"][model] == source and not fake_sky.calls
    # What launch submits is a valid SkyPilot task: its YAML form parses back (offline) with both mounts.
    plan = launch_plan(
        "--model", model, "--preset", "qwen_image_lora", "--reward", "http://r:8200", model_source=source
    )
    shipped = ship_run_config(plan, tmp_path)
    for task in plan_tasks(plan, SECRETS, shipped):
        again = sky.Task.from_yaml_config(task.to_yaml_config())
        assert again.file_mounts == {model: source, "~/.spotlight/run_config.yaml": str(shipped)}
    _, plain, _ = dry_run_output(_invoke("launch", "--spot-workers", "1", "--store", "s3://b/p", "--dry-run").output)
    assert list(plain["file_mounts"]) == ["~/.spotlight/run_config.yaml"]  # the pixel policy: only the run's file


def test_a_gpu_preset_without_a_reward_or_a_relative_prompts_file_is_refused_before_anything_is_submitted(
    fake_sky,
) -> None:
    base = ("launch", "--spot-workers", "1", "--store", "s3://b/p", "--preset", "qwen_image_lora", "--model", "/m/Qwen")
    no_reward = _invoke(*base)
    assert no_reward.exit_code == 2 and "names no reward: pass --reward" in no_reward.output
    relative = _invoke(*base, "--reward", "minigeneval", "--prompts", "prompts.jsonl")
    assert relative.exit_code == 2 and "train.prompts 'prompts.jsonl' must be an absolute path" in relative.output
    assert not fake_sky.calls


def test_dry_run_with_an_sp_degree_asks_for_nodes_of_that_many_gpus_that_start_the_node_agent(
    fake_sky, tmp_path
) -> None:
    import os

    import sky
    from resources.cloud import plan_tasks, ship_run_config
    from resources.prices import PriceTable
    from tests.pipelines.sky_blocks import stub_run

    result = _invoke(
        "launch",
        "--spot-workers",
        "2",
        "--store",
        "s3://b/p",
        "--gpu",
        "H100",
        "--sp-degree",
        "4",
        "--gpus-per-node",
        "8",
        "--dry-run",
    )
    assert result.exit_code == 0, result.output
    _, reserved, workers = dry_run_output(result.output)
    assert "SP_DEGREE" not in reserved["envs"] and not fake_sky.calls
    for w in workers:
        assert [r["accelerators"] for r in w["resources"]] == [{"H100": 8}] and w["envs"]["SP_DEGREE"] == "4"
        assert float(w["envs"]["USD_PER_HOUR"]) == pytest.approx(8 * PriceTable().usd_per_hour("H100", spot=True)[0])
    any_of = launch_plan(sp_degree="auto", gpus_per_node=4)
    (_, task) = plan_tasks(any_of, SECRETS, ship_run_config(any_of, tmp_path))
    again = sky.Task.from_yaml_config(task.to_yaml_config())  # what launch submits parses back (offline)
    assert {tuple(r.accelerators.items()) for r in again.resources} == {
        ((next(iter(r.accelerators)), 4),) for r in _yaml_task("spot_workers.yaml").resources
    }
    assert all(r.use_spot for r in again.resources) and again.envs["SP_DEGREE"] == "auto"
    dearest = max(PriceTable().usd_per_hour(next(iter(r.accelerators)), spot=True)[0] for r in again.resources)
    assert float(again.envs["USD_PER_HOUR"]) == pytest.approx(4 * dearest), "a node's price, erring high"
    again.update_envs({"SKYPILOT_NUM_GPUS_PER_NODE": "4"})  # what SkyPilot sets on the node
    commands = {argv[2]: argv[3:] for argv in stub_run(again, tmp_path, os.environ) if argv[:2] == ["python", "-m"]}
    flags = commands["workers.sp"]
    assert flags[flags.index("--workers") + 1] == "4" and flags[flags.index("--degree") + 1] == "auto"
    assert flags[flags.index("--config") + 1].endswith("/.spotlight/run_config.yaml")  # its knobs, model, device


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict:
    """Tiny pipelines on this machine: Qwen-Image with 4 attention heads, SD3 (no context-parallel plan)."""
    from workers.model.families.tiny import build_tiny_pipeline

    root = tmp_path_factory.mktemp("models")
    return {
        "qwen": build_tiny_pipeline("qwen-image", root / "qwen", num_heads=4),
        "sd3": build_tiny_pipeline("sd3", root / "sd3"),
    }


@pytest.mark.parametrize(
    "model, args, message",
    [
        ("qwen", ["--sp-degree", "8"], "SP degree 8 must divide the 4 attention heads"),
        ("sd3", ["--sp-degree", "2"], "SD3Transformer2DModel, the transformer of"),
        ("sd3", ["--sp-degree", "auto", "--gpus-per-node", "4"], "--sp-degree auto: no degree from 2 to 4 splits"),
    ],
)
def test_an_sp_degree_the_models_transformer_cannot_take_is_refused_before_anything_is_submitted(
    fake_sky, tiny_models, model, args, message
) -> None:
    result = _invoke("launch", "--spot-workers", "1", "--store", "s3://b/p", "--model", str(tiny_models[model]), *args)
    assert result.exit_code == 2 and message in result.output and fake_sky.calls == []


def test_an_sp_degree_the_model_takes_launches_and_a_folder_only_on_the_nodes_is_left_to_them(fake_sky, tiny_models):
    fits = _invoke(
        "launch",
        "--spot-workers",
        "1",
        "--store",
        "s3://b/p",
        "--model",
        str(tiny_models["qwen"]),
        "--sp-degree",
        "4",
        "--dry-run",
    )
    assert fits.exit_code == 0 and "not checked" not in fits.output, fits.output
    elsewhere = _invoke(
        "launch",
        "--spot-workers",
        "1",
        "--store",
        "s3://b/p",
        "--model",
        "/models/Qwen-Image",
        "--preset",
        "qwen_image_lora",
        "--reward",
        "http://rewards:8200",
        "--sp-degree",
        "2",
        "--dry-run",
    )
    assert elsewhere.exit_code == 0 and "--sp-degree 2 not checked against --model" in elsewhere.output, (
        elsewhere.output
    )


@pytest.mark.parametrize(
    "clouds, message",
    [
        ([], "no cloud is enabled"),
        (sky_exceptions.ApiServerConnectionError("http://127.0.0.1:46580"), "could not list"),
        (sky_exceptions.ApiServerAuthenticationError("https://sky.example.com"), "could not list"),
    ],
)
def test_launch_without_an_enabled_cloud_submits_nothing_and_names_sky_check(fake_sky, clouds, message) -> None:
    fake_sky.clouds = clouds
    result = _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 1 and message in result.output and "`sky check`" in result.output
    assert fake_sky.submitted == []


def test_launch_without_the_redis_password_submits_nothing_and_says_what_to_export(fake_sky, monkeypatch) -> None:
    monkeypatch.delenv("SPOTLIGHT_REDIS_PASSWORD")
    result = _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 1 and "export SPOTLIGHT_REDIS_PASSWORD" in result.output and fake_sky.calls == []
    dry = _invoke(
        "launch", "--spot-workers", "1", "--store", "s3://b/p", "--dry-run"
    )  # still shows what it would submit
    assert dry.exit_code == 0 and dry_run_output(dry.output)[2][0]["secrets"]["SPOTLIGHT_REDIS_PASSWORD"] is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--store", "/data/store"], "--store (deployment.store) must be s3://"),
        ([], "--store (deployment.store) must be s3://"),
        (["--store", "s3://b/p", "--gpu", "B200"], "give distinct accelerator names from A100"),
        (["--store", "s3://b/p", "--max-usd", "0"], "--max-usd must be a positive"),
        (["--store", "s3://b/p", "--preset", "gpu_huge"], "unknown preset 'gpu_huge'; choose one of"),
        (["--store", "s3://b/p", "--model", "models/qwen"], "model.model 'models/qwen' must be an absolute path"),
        (["--store", "s3://b/p", "--group-sise", "4"], "unknown key 'group-sise'; did you mean"),
        (["--store", "s3://b/p", "--group-size", "1"], "train.group_size: Input should be greater than or equal to 2"),
        (
            ["--store", "s3://b/p", "--rollouts", "inprocess", "--explore-samples", "8"],
            "a cloud run has deployment.deployment 'cloud'",
        ),
        (["--store", "s3://b/p", "--model-source", "s3://w/qwen"], "--model-source needs --model"),
        (
            [
                "--store",
                "s3://b/p",
                "--model",
                "/models/qwen",
                "--preset",
                "flux1_lora",
                "--model-source",
                "/data/qwen",
            ],
            "must be a bucket URL",
        ),
        (["--store", "s3://b/p", "--reserved-gpus", "H100:0"], "--reserved-gpus must be NAME[:COUNT]"),
        (["--store", "s3://b/p", "--reserved-gpus", "TPU:8"], "--reserved-gpus must be NAME[:COUNT]"),
        (["--store", "s3://b/p", "--sp-degree", "two"], "--sp-degree must be an integer >= 1 or auto, got 'two'"),
        (["--store", "s3://b/p", "--sp-degree", "0"], "--sp-degree must be an integer >= 1 or auto, got 0"),
        (["--store", "s3://b/p", "--gpus-per-node", "8"], "--gpus-per-node 8 needs --sp-degree"),
        (["--store", "s3://b/p", "--sp-degree", "auto"], "--sp-degree auto needs --gpus-per-node N >= 2"),
        (
            ["--store", "s3://b/p", "--sp-degree", "3", "--gpus-per-node", "8"],
            "--sp-degree 3 must divide --gpus-per-node 8",
        ),
    ],
)
def test_bad_launch_flags_are_refused_before_anything_is_submitted(fake_sky, args, message) -> None:
    result = _invoke("launch", "--spot-workers", "2", *args)
    assert result.exit_code == 2 and message in result.output and fake_sky.calls == []
