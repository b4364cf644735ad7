"""A recording stand-in for SkyPilot's API server, built from SkyPilot's own functions, records and exceptions, for
the `spotlight launch / status / down` tests (no cloud here)."""

from __future__ import annotations

import inspect
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from sky import exceptions as sky_exceptions

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
    controller: Any = None
    """{cloud: (instance type, $/hour)} that sky.catalog answers for the jobs controller's resources; None: a
    ConnectionError (no network)."""
    identities: list[tuple[str, Any]] = field(default_factory=list)
    """(SDK function, the aws.remote_identity its request carried to the API server) for each launch request."""
    _answers: dict[str, Any] = field(default_factory=dict)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> "FakeSky":
        import resources.cloud as cloud
        import sky

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
            return {
                name: [o for o in offers if o.accelerator_count == given.get("quantity_filter", o.accelerator_count)]
                for name, offers in self.catalog.items()
                if pattern.search(name)
            }

        monkeypatch.setattr(sky.catalog, "list_accelerators", list_accelerators)
        self._install_controller_catalog(monkeypatch)
        from sky.utils import annotations

        monkeypatch.setattr(annotations, "is_on_api_server", False)  # a client process (set by any real SDK call)
        monkeypatch.setattr(sky, "get", self._get)
        monkeypatch.setattr(sky, "stream_and_get", self._get)
        for module, name, answer in (
            (sky, "launch", self._launch),
            (sky, "endpoints", self._endpoints),
            (sky, "down", self._down),
            (sky.jobs, "launch", self._jobs_launch),
            (sky.jobs, "queue_v2", self._queue),
            (sky.jobs, "cancel", self._cancel),
        ):
            monkeypatch.setattr(module, name, self._request(getattr(module, name), answer))
        return self

    def _install_controller_catalog(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """sky.catalog's default instance type and hourly cost, with their real signatures, from `controller`."""
        import requests
        import sky.catalog

        def offline():
            return requests.exceptions.ConnectionError("Failed to fetch the catalog (no network)")

        default_signature = inspect.signature(sky.catalog.get_default_instance_type)
        cost_signature = inspect.signature(sky.catalog.get_hourly_cost)

        def default_instance_type(*args, **kwargs):
            cloud = default_signature.bind(*args, **kwargs).arguments.get("clouds")
            if self.controller is None:
                raise offline()
            return self.controller.get(cloud, (None, None))[0]

        def hourly_cost(*args, **kwargs):
            given = cost_signature.bind(*args, **kwargs).arguments
            if self.controller is None:
                raise offline()
            return dict(self.controller.values())[given["instance_type"]]

        monkeypatch.setattr(sky.catalog, "get_default_instance_type", default_instance_type)
        monkeypatch.setattr(sky.catalog, "get_hourly_cost", hourly_cost)

    def _request(self, real, answer):
        signature = inspect.signature(real)

        def submit(*args, **kwargs):
            from sky.server.requests import payloads

            arguments = signature.bind(*args, **kwargs)
            arguments.apply_defaults()
            if real.__name__ == "launch":  # the client config the real SDK puts in the request body
                config = payloads.get_override_skypilot_config_from_client()
                self.identities.append((real.__module__, dict(config.get("aws") or {}).get("remote_identity")))
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
        if not self.cluster_exists:  # what sky.backends.backend_utils.get_endpoints raises for an unknown cluster
            raise sky_exceptions.ClusterNotUpError(f"Cluster {cluster!r} not found.", cluster_status=None)
        return {port: self.address}

    def _down(self, cluster_name, **options):
        if not self.cluster_exists:
            raise sky_exceptions.ClusterDoesNotExist(f"Cluster {cluster_name!r} does not exist.")
        self.calls.append(("down", (cluster_name,), options))

    def _queue(self, refresh, skip_finished, name_match, **options):
        if not self.controller_up and not refresh:
            raise sky_exceptions.ClusterNotUpError("Jobs controller is not up.", cluster_status=None)
        records = [
            r
            for r in self.jobs
            if (name_match or "") in (r.job_name or "") and not (skip_finished and r.status.is_terminal())
        ]
        return records, len(records), {}, len(self.jobs)

    def _cancel(self, job_ids, **options):
        self.calls.append(("jobs.cancel", (list(job_ids),), options))

    @property
    def submitted(self) -> list[str]:
        return [name for name, *_ in self.calls if name in ("launch", "jobs.launch")]


def served_task(task):
    """The task as SkyPilot's API server gets it: the client's YAML dump loaded back, then the server's secret
    resolution (`sky.execution._resolve_managed_secrets`, which refuses a secret with no value)."""
    from sky.utils import dag_utils

    from sky import execution

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


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})  # one error line, unwrapped


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
    """A redis-server configured by resources.queue.redis_tls from the TLS files `spotlight launch` reads (made here
    first, in the state folder), with the launch password; the fake node's address points at it."""
    import os
    import shutil
    import signal
    import socket
    import subprocess

    from resources.cloud import tls_folder, with_run_tls
    from resources.queue.redis_tls import run_tls, write_node_files
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
    wait_for(
        lambda: (folder / "redis.pid").exists() and socket.socket().connect_ex(("127.0.0.1", port)) == 0,
        20,
        "the node's redis-server",
    )
    fake_sky.address = f"127.0.0.1:{port}"
    yield NodeRedis(port, password, folder)
    os.kill(int((folder / "redis.pid").read_text()), signal.SIGTERM)


def node_queue(node: NodeRedis, monkeypatch):
    """The coordinator's connection to the node's Redis (this process trusting the run's CA)."""
    from resources.cloud import use_run_ca
    from resources.queue import open_queue

    monkeypatch.setenv("SPOTLIGHT_REDIS_RUN_CA", "")
    assert use_run_ca("spotlight-reserved")
    return open_queue(node.url())


def launch_plan(*flags: str, spot_workers: int = 1, **cloud):
    """A LaunchPlan as `spotlight launch --spot-workers N --store s3://b/p FLAGS` makes it: the run settings' flags
    resolved against the config tree (the launch's defaults, no file, no variables), the cloud's options as given."""
    from pipelines.launch_config import resolve_launch_run
    from resources.cloud import LaunchPlan

    run = resolve_launch_run(None, ["--store", "s3://b/p", *flags], {})
    return LaunchPlan(spot_workers=spot_workers, run=run, **cloud)


def dry_run_output(output: str) -> tuple[dict, dict, list[dict]]:
    """`spotlight launch --dry-run`'s JSON: the run's config tree, the reserved node's task, the spot workers'."""
    (line,) = [line for line in output.splitlines() if line.startswith("{")]
    shown = json.loads(line)
    reserved, *workers = shown["tasks"]
    return shown["run_config"], reserved, workers
