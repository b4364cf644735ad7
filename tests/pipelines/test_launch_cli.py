"""`spotlight launch / status / down`: what they would submit, what they refuse, and what they show.

SkyPilot's API is replaced by a recording fake (no cloud here); the tasks themselves are
real `sky.Task` objects parsed from sky/*.yaml, and the dry run is checked against them.
"""

from __future__ import annotations

import inspect
import json
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.paths import REPO_ROOT
from sky import exceptions as sky_exceptions
from typer.testing import CliRunner

from pipelines.cli import app

PASSWORD = "launch-pass-Vw2"
SECRETS = {"SPOTLIGHT_REDIS_PASSWORD": PASSWORD, "AWS_ACCESS_KEY_ID": "AKIATEST", "AWS_SECRET_ACCESS_KEY": "s3cr3t-key"}


@dataclass
class FakeSky:
    """SkyPilot's client SDK with only its API server replaced. Each SDK function keeps its real signature (every call
    is bound to the installed function's, so a call SkyPilot would refuse fails here), returns a request id, and
    `sky.get` answers it as the server would: tasks pass through SkyPilot's own YAML round trip and secret
    resolution, jobs are SkyPilot's `ManagedJobRecord`s, a stopped controller raises its `ClusterNotUpError`."""

    clouds: Any = field(default_factory=lambda: ["AWS"])
    address: str = "10.0.0.7:6379"
    calls: list[tuple[str, Any]] = field(default_factory=list)
    jobs: list[Any] = field(default_factory=list)
    """ManagedJobRecords the jobs controller holds."""
    controller_up: bool = True
    cluster_exists: bool = True
    catalog: Any = None
    """Offers sky.catalog.list_accelerators answers ({name: [InstanceTypeInfo]}), or the exception it raises;
    None: a ConnectionError, as without network (the catalog downloads its tables)."""
    _answers: dict[str, Any] = field(default_factory=dict)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "FakeSky":
        import sky

        import resources.cloud as cloud

        def enabled():
            if isinstance(self.clouds, Exception):
                raise self.clouds
            return self.clouds

        monkeypatch.setattr(cloud, "_enabled_clouds", enabled)
        import sky.catalog

        catalog_signature = inspect.signature(sky.catalog.list_accelerators)

        def list_accelerators(*args, **kwargs):
            import re

            import requests

            given = catalog_signature.bind(*args, **kwargs).arguments
            if self.catalog is None or isinstance(self.catalog, Exception):
                raise self.catalog or requests.exceptions.ConnectionError("Failed to fetch the catalog (no network)")
            pattern = re.compile(given.get("name_filter") or "", 0 if given.get("case_sensitive", True) else re.I)
            return {name: [o for o in offers if o.accelerator_count == given.get("quantity_filter", o.accelerator_count)]
                    for name, offers in self.catalog.items() if pattern.search(name)}

        monkeypatch.setattr(sky.catalog, "list_accelerators", list_accelerators)
        monkeypatch.setattr(sky, "get", self._get)
        monkeypatch.setattr(sky, "stream_and_get", self._get)
        for module, name, answer in ((sky, "launch", self._launch), (sky, "endpoints", self._endpoints),
                                     (sky, "down", self._down), (sky.jobs, "launch", self._jobs_launch),
                                     (sky.jobs, "queue_v2", self._queue), (sky.jobs, "cancel", self._cancel)):
            monkeypatch.setattr(module, name, self._request(getattr(module, name), answer))
        return self

    def _request(self, real, answer):
        signature = inspect.signature(real)

        def submit(*args, **kwargs):
            arguments = signature.bind(*args, **kwargs)
            arguments.apply_defaults()
            request_id = f"request-{len(self._answers)}"
            self._answers[request_id] = lambda: answer(**arguments.arguments)
            return request_id
        return submit

    def _get(self, request_id):
        return self._answers.pop(request_id)()

    def _launch(self, task, cluster_name, **options):
        self.calls.append(("launch", (served_task(task), cluster_name), options))
        return 1, None

    def _jobs_launch(self, task, name, **options):
        self.calls.append(("jobs.launch", (served_task(task), name), options))
        return [len(self.calls)], None

    def _endpoints(self, cluster, port):
        return {port: self.address}

    def _down(self, cluster_name, **options):
        if not self.cluster_exists:
            raise sky_exceptions.ClusterDoesNotExist(f"Cluster {cluster_name!r} does not exist.")
        self.calls.append(("down", (cluster_name,), options))

    def _queue(self, refresh, skip_finished, name_match, **options):
        if not self.controller_up and not refresh:
            raise sky_exceptions.ClusterNotUpError("Jobs controller is not up.", cluster_status=None)
        records = [r for r in self.jobs if (name_match or "") in (r.job_name or "")
                   and not (skip_finished and r.status.is_terminal())]
        return records, len(records), {}, len(self.jobs)

    def _cancel(self, job_ids, **options):
        self.calls.append(("jobs.cancel", (list(job_ids),), options))

    @property
    def submitted(self) -> list[str]:
        return [name for name, *_ in self.calls if name in ("launch", "jobs.launch")]


def served_task(task):
    """The task as SkyPilot's API server gets it: the client's YAML dump loaded back, then the server's secret
    resolution (`sky.execution._resolve_managed_secrets`, which refuses a secret with no value)."""
    from sky import execution
    from sky.utils import dag_utils

    dag = dag_utils.load_dag_from_yaml_str(dag_utils.dump_dag_to_yaml_str(dag_utils.convert_entrypoint_to_dag(task)))
    execution._resolve_managed_secrets(dag)
    (served,) = dag.tasks
    return served


def offer(cloud: str, instance: str, gpu: str, count: int, price: float, spot_price: float):
    """One catalog row as sky.catalog.list_accelerators returns it."""
    from sky.catalog.common import InstanceTypeInfo

    return InstanceTypeInfo(cloud, instance, gpu, count, 8.0, 24.0, 32.0, price, spot_price, "us-east-1")


def job(name: str, job_id: int, status: str):
    """A managed job as `sky.jobs.queue_v2` returns it."""
    from sky.jobs.state import ManagedJobStatus
    from sky.schemas.api.responses import ManagedJobRecord

    return ManagedJobRecord(job_name=name, job_id=job_id, status=ManagedJobStatus[status])


@pytest.fixture
def fake_sky(monkeypatch: pytest.MonkeyPatch, tmp_path) -> FakeSky:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SPOTLIGHT_REDIS_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("SPOTLIGHT_STATE_DIR", str(tmp_path / "state"))  # the run's TLS files: never in ~
    monkeypatch.setenv("SPOTLIGHT_REDIS_RUN_CA", "")  # restored after each test: launch and status set it
    return FakeSky().install(monkeypatch)


def _invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})  # one error line, unwrapped


def _yaml_task(name: str):
    import sky

    return sky.Task.from_yaml(str(REPO_ROOT / "sky" / name))


def _yaml_secrets(name: str) -> list[str]:
    """The secret names the YAML declares (SkyPilot's parser drops those whose value is null)."""
    import yaml

    return list(yaml.safe_load((REPO_ROOT / "sky" / name).read_text())["secrets"])


PLANS = {"default": {}, "one_gpu": {"gpus": ("A100",)}, "sp_nodes": {"sp_degree": "auto", "gpus_per_node": 4},
         "model": {"model": "/models/Qwen-Image", "model_source": "s3://weights/Qwen-Image", "preset": "qwen_image_lora",
                   "reward": "http://rewards:8200", "prompts": "/data/prompts.jsonl"}}


@pytest.mark.parametrize("plan", PLANS)
def test_every_task_launch_submits_passes_skypilots_yaml_round_trip_and_secret_resolution(plan) -> None:
    """What SkyPilot's API server does with each task before provisioning: load the client's YAML dump, then
    resolve secrets (a declared secret with no value is refused there: "No value available for secret(s)")."""
    from resources.cloud import LaunchPlan, plan_tasks, with_run_tls
    from resources.queue_redis_tls import make_run_tls, worker_password

    tls = make_run_tls()
    secrets = with_run_tls(SECRETS, tls)
    tasks = plan_tasks(LaunchPlan(workers=2, store="s3://b/p", **PLANS[plan]), secrets, "rediss://w@10.0.0.7:6379/0")
    assert len(tasks) == 3
    expected = [{**SECRETS, "SPOTLIGHT_REDIS_TLS_CERT": tls.b64("cert_pem"), "SPOTLIGHT_REDIS_TLS_KEY": tls.b64("key_pem")}]
    expected += [{**SECRETS, "SPOTLIGHT_REDIS_PASSWORD": worker_password(SECRETS["SPOTLIGHT_REDIS_PASSWORD"])}] * 2
    for task, secrets_of_task in zip(tasks, expected):
        served = served_task(task)
        assert {k: v.get_secret_value() for k, v in served.secrets.items()} == secrets_of_task
        assert served.envs["SPOTLIGHT_REDIS_RUN_CA"] == tls.b64("ca_pem")
        assert not served.managed_secret_refs and served.envs == task.envs and served.name == task.name
        assert {str(r) for r in served.resources} == {str(r) for r in task.resources}
    with pytest.raises(RuntimeError, match="No value available for secret"):  # a dry run's tasks: nothing to resolve
        served_task(plan_tasks(LaunchPlan(workers=1, store="s3://b/p", **PLANS[plan]), {})[0])


def test_dry_run_prints_the_reserved_task_and_one_spot_task_per_worker_as_skypilot_parses_them(fake_sky) -> None:
    from resources.prices import PriceTable

    result = _invoke("launch", "--workers", "3", "--store", "s3://bucket/run", "--max-usd", "200", "--dry-run")
    assert result.exit_code == 0, result.output
    reserved, *workers = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert not fake_sky.calls and PASSWORD not in result.output and "s3cr3t" not in result.output
    yaml_reserved, yaml_spot = _yaml_task("reserved.yaml"), _yaml_task("spot_workers.yaml")
    (r,) = yaml_reserved.resources
    assert reserved["resources"] == [{"accelerators": dict(r.accelerators), "use_spot": False, "job_recovery": None,
                                      "ports": list(r.ports), "cloud": None}]
    ca = reserved["envs"]["SPOTLIGHT_REDIS_RUN_CA"]  # a throwaway CA: a dry run keeps nothing
    assert __import__("base64").b64decode(ca).startswith(b"-----BEGIN CERTIFICATE-----")
    assert reserved["envs"] == {**yaml_reserved.envs, "SPOTLIGHT_STORE": "s3://bucket/run", "MAX_USD": "200",
                                "SPOTLIGHT_REDIS_RUN_CA": ca}
    assert all(w["envs"]["SPOTLIGHT_REDIS_RUN_CA"] == ca for w in workers)
    assert reserved["secrets"] == {name: "***" for name in _yaml_secrets("reserved.yaml")} != {}
    assert [w["name"] for w in workers] == ["spotlight-rollout-1", "spotlight-rollout-2", "spotlight-rollout-3"]
    for w in workers:  # no --gpu: the YAML's any_of, every option spot with the YAML's job recovery
        assert w["any_of"] and {next(iter(r["accelerators"])) for r in w["resources"]} == {
            next(iter(r.accelerators)) for r in yaml_spot.resources}
        assert all(r["use_spot"] and r["job_recovery"] == next(iter(yaml_spot.resources)).job_recovery for r in w["resources"])
        assert w["envs"]["SPOTLIGHT_STORE"] == "s3://bucket/run" and w["secrets"] == {n: "***" for n in _yaml_secrets("spot_workers.yaml")}
        dearest = max(PriceTable().usd_per_hour(next(iter(r.accelerators)), spot=True)[0] for r in yaml_spot.resources)
        assert float(w["envs"]["USD_PER_HOUR"]) == pytest.approx(dearest)  # not the YAML's flat one-GPU figure


def test_dry_run_with_one_gpu_pins_the_workers_to_it_and_prices_them_from_the_table(fake_sky) -> None:
    from resources.prices import PriceTable

    result = _invoke("launch", "--workers", "1", "--gpu", "A100", "--store", "s3://b/p", "--dry-run")
    worker = json.loads(result.output.splitlines()[-1])
    assert [r["accelerators"] for r in worker["resources"]] == [{"A100": 1}] and not worker["any_of"]
    assert worker["resources"][0]["job_recovery"]["recover_on_exit_codes"] == [75]
    assert float(worker["envs"]["USD_PER_HOUR"]) == pytest.approx(PriceTable().usd_per_hour("A100", spot=True)[0])


def test_dry_run_with_a_model_hands_it_to_both_tasks_and_mounts_its_bucket_at_that_path(fake_sky) -> None:
    import sky

    from resources.cloud import LaunchPlan, plan_tasks

    model, source = "/models/Qwen-Image", "s3://weights/models/Qwen-Image"
    result = _invoke("launch", "--workers", "2", "--store", "s3://b/p", "--preset", "qwen_image_lora", "--model", model,
                     "--model-source", source, "--reward", "http://rewards:8200", "--prompts", "/data/prompts.jsonl",
                     "--dry-run")
    assert result.exit_code == 0, result.output
    reserved, *workers = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert reserved["envs"]["MODEL"] == model and reserved["envs"]["PRESET"] == "qwen_image_lora"
    assert (reserved["envs"]["REWARD"], reserved["envs"]["PROMPTS"]) == ("http://rewards:8200", "/data/prompts.jsonl")
    assert reserved["envs"]["LOCAL_WORKERS"] == "0"  # the node's CPU workers cannot sample a diffusers pipeline
    assert all(w["envs"]["MODEL"] == model for w in workers)
    assert all(t["file_mounts"] == {model: source} for t in (reserved, *workers)) and not fake_sky.calls
    # What launch submits is a valid SkyPilot task: its YAML form parses back (offline) with the mount and MODEL.
    plan = LaunchPlan(workers=1, store="s3://b/p", model=model, model_source=source)
    for task in plan_tasks(plan, SECRETS):
        again = sky.Task.from_yaml_config(task.to_yaml_config())
        assert again.file_mounts == {model: source} and again.envs["MODEL"] == model
    plain = json.loads(_invoke("launch", "--workers", "1", "--store", "s3://b/p", "--dry-run").output.splitlines()[-1])
    assert plain["envs"]["MODEL"] == "" and plain["file_mounts"] == {}  # the pixel policy, nothing mounted


def test_a_gpu_preset_without_a_reward_or_a_relative_prompts_file_is_refused_before_anything_is_submitted(
        fake_sky) -> None:
    base = ("launch", "--workers", "1", "--store", "s3://b/p", "--preset", "qwen_image_lora", "--model", "/m/Qwen")
    no_reward = _invoke(*base)
    assert no_reward.exit_code == 2 and "names no reward: pass --reward" in no_reward.output
    relative = _invoke(*base, "--reward", "minigeneval", "--prompts", "prompts.jsonl")
    assert relative.exit_code == 2 and "must be an absolute file path" in relative.output
    assert not fake_sky.calls


def test_dry_run_with_an_sp_degree_asks_for_nodes_of_that_many_gpus_that_start_the_node_agent(fake_sky, tmp_path) -> None:
    import os

    import sky

    from resources.cloud import LaunchPlan, plan_tasks
    from resources.prices import PriceTable
    from tests.pipelines.sky_blocks import stub_run

    result = _invoke("launch", "--workers", "2", "--store", "s3://b/p", "--gpu", "H100", "--sp-degree", "4",
                     "--gpus-per-node", "8", "--dry-run")
    assert result.exit_code == 0, result.output
    reserved, *workers = [json.loads(line) for line in result.output.splitlines() if line.startswith("{")]
    assert "SP_DEGREE" not in reserved["envs"] and not fake_sky.calls
    for w in workers:
        assert [r["accelerators"] for r in w["resources"]] == [{"H100": 8}] and w["envs"]["SP_DEGREE"] == "4"
        assert float(w["envs"]["USD_PER_HOUR"]) == pytest.approx(8 * PriceTable().usd_per_hour("H100", spot=True)[0])
    any_of = LaunchPlan(workers=1, store="s3://b/p", sp_degree="auto", gpus_per_node=4)
    (_, task) = plan_tasks(any_of, SECRETS)
    again = sky.Task.from_yaml_config(task.to_yaml_config())  # what launch submits parses back (offline)
    assert {tuple(r.accelerators.items()) for r in again.resources} == {
        ((next(iter(r.accelerators)), 4),) for r in _yaml_task("spot_workers.yaml").resources}
    assert all(r.use_spot for r in again.resources) and again.envs["SP_DEGREE"] == "auto"
    dearest = max(PriceTable().usd_per_hour(next(iter(r.accelerators)), spot=True)[0] for r in again.resources)
    assert float(again.envs["USD_PER_HOUR"]) == pytest.approx(4 * dearest), "a node's price, erring high"
    again.update_envs({"SKYPILOT_NUM_GPUS_PER_NODE": "4"})  # what SkyPilot sets on the node
    commands = {argv[2]: argv[3:] for argv in stub_run(again, tmp_path, os.environ) if argv[:2] == ["python", "-m"]}
    flags = commands["workers.sp"]
    assert flags[flags.index("--workers") + 1] == "4" and flags[flags.index("--degree") + 1] == "auto"


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict:
    """Tiny pipelines on this machine: Qwen-Image with 4 attention heads, SD3 (no context-parallel plan)."""
    from workers.model.families.tiny import build_tiny_pipeline

    root = tmp_path_factory.mktemp("models")
    return {"qwen": build_tiny_pipeline("qwen-image", root / "qwen", num_heads=4),
            "sd3": build_tiny_pipeline("sd3", root / "sd3")}


@pytest.mark.parametrize("model, args, message", [
    ("qwen", ["--sp-degree", "8"], "SP degree 8 must divide the 4 attention heads"),
    ("sd3", ["--sp-degree", "2"], "SD3Transformer2DModel, the transformer of"),
    ("sd3", ["--sp-degree", "auto", "--gpus-per-node", "4"], "--sp-degree auto: no degree from 2 to 4 splits"),
])
def test_an_sp_degree_the_models_transformer_cannot_take_is_refused_before_anything_is_submitted(
        fake_sky, tiny_models, model, args, message) -> None:
    result = _invoke("launch", "--workers", "1", "--store", "s3://b/p", "--model", str(tiny_models[model]), *args)
    assert result.exit_code == 2 and message in result.output and fake_sky.calls == []


def test_an_sp_degree_the_model_takes_launches_and_a_folder_only_on_the_nodes_is_left_to_them(fake_sky, tiny_models):
    fits = _invoke("launch", "--workers", "1", "--store", "s3://b/p", "--model", str(tiny_models["qwen"]),
                   "--sp-degree", "4", "--dry-run")
    assert fits.exit_code == 0 and "not checked" not in fits.output, fits.output
    elsewhere = _invoke("launch", "--workers", "1", "--store", "s3://b/p", "--model", "/models/Qwen-Image",
                        "--sp-degree", "2", "--dry-run")
    assert elsewhere.exit_code == 0 and "--sp-degree 2 not checked against --model" in elsewhere.output


@pytest.mark.parametrize("clouds, message", [([], "no cloud is enabled"), (RuntimeError("API server down"), "could not list")])
def test_launch_without_an_enabled_cloud_submits_nothing_and_names_sky_check(fake_sky, clouds, message) -> None:
    fake_sky.clouds = clouds
    result = _invoke("launch", "--workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 1 and message in result.output and "`sky check`" in result.output
    assert fake_sky.submitted == []


def test_launch_without_the_redis_password_submits_nothing_and_says_what_to_export(fake_sky, monkeypatch) -> None:
    monkeypatch.delenv("SPOTLIGHT_REDIS_PASSWORD")
    result = _invoke("launch", "--workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 1 and "export SPOTLIGHT_REDIS_PASSWORD" in result.output and fake_sky.calls == []
    dry = _invoke("launch", "--workers", "1", "--store", "s3://b/p", "--dry-run")  # still shows what it would submit
    assert dry.exit_code == 0 and json.loads(dry.output.splitlines()[-1])["secrets"]["SPOTLIGHT_REDIS_PASSWORD"] is None


@pytest.mark.parametrize("args, message", [
    (["--store", "/data/store"], "--store must be s3://"),
    (["--store", "s3://b/p", "--gpu", "B200"], "give distinct accelerator names from A100"),
    (["--store", "s3://b/p", "--max-usd", "0"], "--max-usd must be a positive"),
    (["--store", "s3://b/p", "--preset", "gpu_huge"], "unknown; choose one of"),
    (["--store", "s3://b/p", "--model", "models/qwen"], "must be an absolute folder path"),
    (["--store", "s3://b/p", "--model-source", "s3://w/qwen"], "--model-source needs --model"),
    (["--store", "s3://b/p", "--model", "/models/qwen", "--model-source", "/data/qwen"], "must be a bucket URL"),
    (["--store", "s3://b/p", "--sp-degree", "two"], "--sp-degree must be an integer >= 1 or auto, got 'two'"),
    (["--store", "s3://b/p", "--sp-degree", "0"], "--sp-degree must be an integer >= 1 or auto, got 0"),
    (["--store", "s3://b/p", "--gpus-per-node", "8"], "--gpus-per-node 8 needs --sp-degree"),
    (["--store", "s3://b/p", "--sp-degree", "auto"], "--sp-degree auto needs --gpus-per-node N >= 2"),
    (["--store", "s3://b/p", "--sp-degree", "3", "--gpus-per-node", "8"], "--sp-degree 3 must divide --gpus-per-node 8"),
])
def test_bad_launch_flags_are_refused_before_anything_is_submitted(fake_sky, args, message) -> None:
    result = _invoke("launch", "--workers", "2", *args)
    assert result.exit_code == 2 and message in result.output and fake_sky.calls == []


@dataclass
class NodeRedis:
    """The reserved node's Redis as its run block starts it: TLS with the run's CA, the ACL users, the password."""

    port: int
    password: str
    folder: Any

    def url(self, user: str = "") -> str:
        return f"rediss://{user + '@' if user else ''}127.0.0.1:{self.port}/0"


@pytest.fixture
def reserved_redis(fake_sky, tmp_path, monkeypatch):
    """A redis-server configured by resources.queue_redis_tls from the TLS files `spotlight launch` reads (made here
    first, in the state folder), with the launch password; the fake node's address points at it."""
    import os
    import shutil
    import signal
    import socket
    import subprocess

    from resources.cloud import tls_folder, with_run_tls
    from resources.queue_redis_tls import run_tls, write_node_files
    from tests.pipelines.sky_blocks import wait_for

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    password = "node-pass-\"q'\\ 7"  # quotes, a backslash and a space: any character is allowed
    monkeypatch.setenv("SPOTLIGHT_REDIS_PASSWORD", password)
    tls = run_tls(tls_folder("spotlight-reserved"))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    folder = tmp_path / "node-redis"
    conf = write_node_files(folder, port, with_run_tls({"SPOTLIGHT_REDIS_PASSWORD": password}, tls))
    subprocess.run(["redis-server", str(conf)], check=True, timeout=30)  # daemonizes, as on the node
    wait_for(lambda: (folder / "redis.pid").exists() and socket.socket().connect_ex(("127.0.0.1", port)) == 0, 20,
             "the node's redis-server")
    fake_sky.address = f"127.0.0.1:{port}"
    yield NodeRedis(port, password, folder)
    os.kill(int((folder / "redis.pid").read_text()), signal.SIGTERM)


def _node_queue(node: NodeRedis, monkeypatch):
    """The coordinator's connection to the node's Redis (this process trusting the run's CA)."""
    from resources.cloud import use_run_ca
    from resources.queues import open_queue

    monkeypatch.setenv("SPOTLIGHT_REDIS_RUN_CA", "")
    assert use_run_ca("spotlight-reserved")
    return open_queue(node.url())


def test_launch_starts_the_reserved_node_then_spot_jobs_pointed_at_its_redis(fake_sky, reserved_redis) -> None:
    """The node gets the password, the server's certificate and key as resolved secrets; each worker gets only the
    run's CA, its queue as the ACL user and that user's own password: never the coordinator's, never the key."""
    import base64

    from resources.queue_redis_tls import worker_password

    node = reserved_redis
    result = _invoke("launch", "--workers", "2", "--gpu", "L4", "--store", "s3://b/p", "--max-usd", "50")
    assert result.exit_code == 0, result.output
    assert fake_sky.submitted == ["launch", "jobs.launch", "jobs.launch"]
    (reserved, cluster) = fake_sky.calls[0][1]
    assert cluster == "spotlight-reserved" and reserved.envs["MAX_USD"] == "50"
    served = {k: v.get_secret_value() for k, v in reserved.secrets.items()}
    assert served["SPOTLIGHT_REDIS_PASSWORD"] == node.password and not reserved.managed_secret_refs
    assert base64.b64decode(served["SPOTLIGHT_REDIS_TLS_KEY"]) == (node.folder / "server.key").read_bytes()
    ca = base64.b64decode(reserved.envs["SPOTLIGHT_REDIS_RUN_CA"])
    assert ca == (node.folder / "ca.pem").read_bytes() and "SPOTLIGHT_REDIS_PASSWORD" not in reserved.envs
    for _, (task, name), _ in [c for c in fake_sky.calls if c[0] == "jobs.launch"]:
        assert task.name == name and task.envs["SPOTLIGHT_QUEUE"] == node.url("spotlight-worker")
        assert base64.b64decode(task.envs["SPOTLIGHT_REDIS_RUN_CA"]) == ca
        assert {k: v.get_secret_value() for k, v in task.secrets.items()} == {
            **SECRETS, "SPOTLIGHT_REDIS_PASSWORD": worker_password(node.password)}
        assert node.password not in json.dumps(task.envs)
    assert node.password not in result.output
    assert "queue rediss://127.0.0.1:" in result.output


def test_the_reserved_node_goes_down_by_itself_once_its_run_block_has_ended(fake_sky, reserved_redis) -> None:
    """The node's autostop (from sky/reserved.yaml, so a launch by hand has it too): down, not stop, a few idle
    minutes after the run line exits (last iteration done or the spend cap reached); open SSH sessions do not
    keep it billing."""
    assert _invoke("launch", "--workers", "1", "--store", "s3://b/p").exit_code == 0
    (reserved, _), options = fake_sky.calls[0][1:]
    (resources,) = reserved.resources
    assert resources.autostop_config.enabled and resources.autostop_config.down
    assert 0 < resources.autostop_config.idle_minutes <= 15 and str(resources.autostop_config.wait_for.value) == "jobs"
    assert options["idle_minutes_to_autostop"] is None and options["down"] is False  # the YAML's setting is not overridden


def test_launch_waits_for_redis_and_submits_no_worker_when_it_never_answers(fake_sky, monkeypatch) -> None:
    import resources.cloud as cloud

    monkeypatch.setattr(cloud, "REDIS_WAIT_S", 0.3)
    fake_sky.address = "127.0.0.1:1"  # the node's setup failed: nothing listens
    started = time.monotonic()
    result = _invoke("launch", "--workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 1 and "did not answer within 0.3 s" in result.output, result.output
    assert "no spot workers submitted" in result.output and "sky logs spotlight-reserved" in result.output
    assert fake_sky.submitted == ["launch"] and time.monotonic() - started < 15


def test_launch_refuses_to_go_on_when_redis_refuses_the_password_or_its_certificate(
        fake_sky, reserved_redis, monkeypatch, tmp_path) -> None:
    import shutil

    from resources.cloud import tls_folder

    shutil.rmtree(tls_folder("spotlight-reserved"))  # this machine lost the run's CA: a new one is made
    result = _invoke("launch", "--workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 1 and "presents a certificate the run's CA did not sign" in result.output
    assert fake_sky.submitted == ["launch"]
    fake_sky.calls.clear()
    (tls_folder("spotlight-reserved") / "ca.pem").write_bytes((reserved_redis.folder / "ca.pem").read_bytes())
    monkeypatch.setenv("SPOTLIGHT_REDIS_RUN_CA", "")
    monkeypatch.setenv("SPOTLIGHT_REDIS_PASSWORD", "not-the-password")
    result = _invoke("launch", "--workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 1 and "refused the password" in result.output and fake_sky.submitted == ["launch"]
    assert "not-the-password" not in result.output


def test_a_second_launch_resumes_the_run_and_submits_only_the_missing_workers(fake_sky, reserved_redis) -> None:
    fake_sky.jobs = [job("spotlight-rollout-1", 4, "RUNNING"), job("spotlight-rollout-2", 5, "FAILED")]
    result = _invoke("launch", "--workers", "3", "--store", "s3://b/p")
    assert result.exit_code == 0, result.output
    assert [args[1] for name, args, _ in fake_sky.calls if name == "jobs.launch"] == ["spotlight-rollout-2",
                                                                                      "spotlight-rollout-3"]
    assert "spotlight-rollout-1 is already running (managed job 4, RUNNING)" in result.output


def test_a_relaunch_over_the_cap_starts_no_more_workers(fake_sky, reserved_redis, monkeypatch) -> None:
    with _node_queue(reserved_redis, monkeypatch) as queue:
        queue.publish_info({"usd_total": 51.5, "max_usd": 50.0})
    result = _invoke("launch", "--workers", "2", "--store", "s3://b/p", "--max-usd", "50")
    assert result.exit_code == 1 and "already spent $51.50" in result.output
    assert fake_sky.submitted == ["launch"]


def test_status_shows_iteration_score_spend_workers_and_queue_depth(redis_server, tmp_path, monkeypatch) -> None:
    from resources.ledger import Ledger
    from resources.queues import open_queue

    redis_server.flush()
    monkeypatch.setenv("SPOTLIGHT_REDIS_PASSWORD", redis_server.password)
    with Ledger(tmp_path / "ledger.duckdb") as ledger:
        ledger.start_worker("vm-1", role="rollout", instance_type="x", spot=True, usd_per_hour=36.0, at=time.time() - 100)
        ledger.start_iteration(0)
        ledger.end_iteration(0)
    with open_queue(f"redis://127.0.0.1:{redis_server.port}/0") as queue:
        queue.put([{"request_id": f"r{i}", "iteration": 1, "kind": "rollout", "payload": {}} for i in range(3)])
        queue.publish_info({"heldout_score": 0.4, "max_usd": 10.0})
    args = ["status", "--queue", f"redis://127.0.0.1:{redis_server.port}/0", "--ledger", str(tmp_path / "ledger.duckdb")]
    record = json.loads(_invoke(*args, "--json").output)
    assert record["iteration"] == 0 and record["queue_pending"] == 3 and record["workers_alive"] == 1
    assert record["usd_total"] == pytest.approx(1.0, abs=0.05) and record["max_usd"] == 10.0
    text = _invoke(*args).output
    assert "iteration 0" in text and "3 pending" in text and "of $10" in text


def test_status_without_flags_finds_the_reserved_node_and_the_spot_jobs_through_skypilot(
        fake_sky, reserved_redis, monkeypatch) -> None:
    with _node_queue(reserved_redis, monkeypatch) as queue:
        queue.publish_info({"iteration": 4, "heldout_score": 0.61, "usd_total": 12.5, "workers_alive": 1})
    fake_sky.jobs = [job("spotlight-rollout-1", 4, "RECOVERING"), job("spotlight-rollout-2", 5, "SUCCEEDED"),
                     job("someone-else", 6, "RUNNING")]
    text = _invoke("status").output
    assert "iteration 4  held-out 0.610  spent $12.50" in text
    assert "  spotlight-rollout-1  job 4  RECOVERING\n" in text + "\n" and "ManagedJobStatus" not in text
    assert "spotlight-rollout-2" not in text and "someone-else" not in text  # finished, and not this project's
    record = json.loads(_invoke("status", "--json").output)
    assert record["spot_jobs"] == [{"name": "spotlight-rollout-1", "job_id": 4, "status": "RECOVERING"}]
    fake_sky.controller_up = False  # it stopped itself after its idle minutes
    stopped = _invoke("status")
    assert stopped.exit_code == 0 and "controller is stopped" in stopped.output and "iteration 4" in stopped.output
    fake_sky.address = "127.0.0.1:1"  # the node is gone
    gone = _invoke("status")
    assert gone.exit_code == 1 and "cannot read the queue" in gone.output


def test_a_queue_url_with_a_password_is_never_echoed_by_status(fake_sky) -> None:
    result = _invoke("status", "--queue", "redis://:pa%22ss%5Cword-Xy9@127.0.0.1:1/0")
    assert result.exit_code == 1 and "cannot read the queue redis://127.0.0.1:1/0" in result.output
    assert "Xy9" not in result.output and "pa%22ss" not in result.output


def test_down_cancels_only_spotlight_worker_jobs_then_the_reserved_node(fake_sky) -> None:
    fake_sky.jobs = [job("spotlight-rollout-1", 4, "RUNNING"), job("someone-else", 5, "RUNNING"),
                     job("spotlight-rollout-2", 6, "RECOVERING"), job("spotlight-rollout-3", 7, "CANCELLED")]
    result = _invoke("down", "--yes")
    assert result.exit_code == 0, result.output
    assert [c[:2] for c in fake_sky.calls] == [("jobs.cancel", ([4, 6],)), ("down", ("spotlight-reserved",))]


def test_down_takes_the_reserved_node_down_when_the_jobs_controller_has_stopped(fake_sky) -> None:
    fake_sky.controller_up = False
    result = _invoke("down", "--yes")
    assert result.exit_code == 0, result.output
    assert [c[:2] for c in fake_sky.calls] == [("down", ("spotlight-reserved",))]
    assert "controller is stopped" in result.output and "spotlight-reserved is down" in result.output
    fake_sky.cluster_exists = False  # and a second down finds nothing to take down
    again = _invoke("down", "--yes")
    assert again.exit_code == 0 and "does not exist (already down)" in again.output


def test_run_json_which_keeps_a_queue_url_as_given_is_readable_by_its_owner_only(tmp_path) -> None:
    from pipelines.run import SPEC_NAME, RunSpec

    (tmp_path / SPEC_NAME).write_text("{}")
    (tmp_path / SPEC_NAME).chmod(0o644)  # written by an older spotlight
    RunSpec(str(tmp_path), queue="redis://:pass-in-url-Q1@10.0.0.7:6379/0", num_workers=0).save()
    assert (tmp_path / SPEC_NAME).stat().st_mode & 0o777 == 0o600
    assert "pass-in-url-Q1" in (tmp_path / SPEC_NAME).read_text()  # kept for --resume, for its owner's eyes only


def test_launch_prices_spot_workers_from_skypilots_catalog_and_falls_back_to_the_table(fake_sky, reserved_redis) -> None:
    """The dearest of the allowed types' cheapest VMs (any_of: which type is free is not known); without the catalog
    (no network) the price table's dearest type, never the YAML's flat $0.50."""
    from resources.prices import PriceTable

    fake_sky.catalog = {"L4": [offer("AWS", "g6.xlarge", "L4", 1, 0.80, 0.31), offer("GCP", "g2-standard-4", "L4", 1, 0.71, 0.28)],
                        "A10G": [offer("AWS", "g5.xlarge", "A10G", 1, 1.01, 0.45)],
                        "A100": [offer("GCP", "a2-highgpu-1g", "A100", 1, 3.67, 1.47),
                                 offer("GCP", "a2-highgpu-2g", "A100", 2, 7.35, float("nan"))],
                        "H100": [offer("AWS", "p5.4xlarge", "H100", 1, 6.88, 2.90), offer("GCP", "a3-highgpu-1g", "H100", 1, 5.38, 2.53)]}
    result = _invoke("launch", "--workers", "1", "--store", "s3://b/p")
    assert result.exit_code == 0, result.output
    (task, _), _ = [c[1:] for c in fake_sky.calls if c[0] == "jobs.launch"][0]
    assert float(task.envs["USD_PER_HOUR"]) == 2.53 and "a3-highgpu-1g on GCP" in result.output
    fake_sky.catalog, fake_sky.calls = None, []
    result = _invoke("launch", "--workers", "1", "--store", "s3://b/p", "--gpu", "L4,A10G")
    (task, _), _ = [c[1:] for c in fake_sky.calls if c[0] == "jobs.launch"][0]
    assert "priced from the price table" in result.output
    assert float(task.envs["USD_PER_HOUR"]) == pytest.approx(max(PriceTable().usd_per_hour(g, spot=True)[0]
                                                                 for g in ("L4", "A10G")))


def test_the_catalog_price_is_the_cheapest_vm_of_the_dearest_type_and_none_without_the_catalog() -> None:
    import requests

    from resources.prices import catalog_node_usd_per_hour

    offers = {"L4": [offer("AWS", "g6.12xlarge", "L4", 4, 4.6, 1.9), offer("GCP", "g2-standard-48", "L4", 4, 4.0, 1.6)],
              "A100": [offer("GCP", "a2-highgpu-4g", "A100", 4, 14.7, float("nan"))]}  # no spot offer

    def listing(**kwargs):
        return {k: v for k, v in offers.items() if k.lower() in kwargs["name_filter"].lower()}

    assert catalog_node_usd_per_hour(("L4",), 4, spot=True, list_accelerators=listing) == (
        1.6, "SkyPilot catalog, spot L4:4: g2-standard-48 on GCP (us-east-1)")
    assert catalog_node_usd_per_hour(("L4", "A100"), 4, spot=False, list_accelerators=listing)[0] == 14.7
    assert catalog_node_usd_per_hour(("L4", "A100"), 4, spot=True, list_accelerators=listing) is None
    assert catalog_node_usd_per_hour(("H100",), 1, spot=True, list_accelerators=listing) is None

    def offline(**kwargs):
        raise requests.exceptions.ConnectionError("Failed to fetch GCP catalog gcp/vms.csv")
    assert catalog_node_usd_per_hour(("L4",), 1, spot=True, list_accelerators=offline) is None
