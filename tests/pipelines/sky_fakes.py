"""A recording stand-in for SkyPilot's API server, built from SkyPilot's own functions, records and exceptions, for
the `spotlight launch / status / down` tests (no cloud here)."""

from __future__ import annotations

import contextlib
import inspect
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from typer.testing import CliRunner

from pipelines.cli import app
from sky import exceptions as sky_exceptions
from tests.pipelines.sky_node import NodeRedis, start_node_redis, stop_node_redis  # noqa: F401 (tests import them here)

PASSWORD = "launch-pass-Vw2x"  # MIN_PASSWORD_CHARS long
SECRETS = {"SPOTLIGHT_REDIS_PASSWORD": PASSWORD, "AWS_ACCESS_KEY_ID": "AKIATEST", "AWS_SECRET_ACCESS_KEY": "s3cr3t-key"}


@dataclass
class FakeSky:
    """SkyPilot's client SDK with only its API server replaced. Each SDK function keeps its real signature (every call
    is bound to the installed function's, so a call SkyPilot would refuse fails here), returns a request id, and
    `sky.get` answers it as the server would: tasks pass through SkyPilot's own YAML round trip and secret
    resolution, jobs are SkyPilot's `ManagedJobRecord`s, a stopped controller raises its `ClusterNotUpError`."""

    clouds: Any = field(default_factory=lambda: ["AWS"])
    address: str = "10.0.0.7:6379"
    """Where this machine reaches the default cluster's Redis (through the stand-in for the SSH tunnel)."""
    addresses: dict[str, str] = field(default_factory=dict)
    """The same for other clusters (runs launched side by side)."""
    calls: list[tuple[str, Any]] = field(default_factory=list)
    jobs: list[Any] = field(default_factory=list)
    """ManagedJobRecords the jobs controller holds: each jobs.launch adds one, RUNNING; jobs.cancel cancels."""
    controller_up: bool = True
    cluster_exists: bool = True
    region: str = "us-east-2"
    """The region every cluster comes up in (SkyPilot's handle records it)."""
    tunnels: list[str] = field(default_factory=list)
    """Clusters this machine opened an SSH tunnel to (a private queue)."""
    catalog: Any = None
    """Offers sky.catalog.list_accelerators answers ({name: [InstanceTypeInfo]}), or the exception it raises;
    None: a ConnectionError, as without network (the catalog downloads its tables)."""
    controller: Any = None
    """{cloud: (instance type, $/hour)} that sky.catalog answers for the jobs controller's resources; None: a
    ConnectionError (no network)."""
    identities: list[tuple[str, Any]] = field(default_factory=list)
    """(SDK function, the aws.remote_identity its request carried to the API server) for each launch request."""
    security_groups: list[Any] = field(default_factory=list)
    """The aws.security_group_name each launch request carried (a private queue's nodes share one)."""
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
            clouds = given.get("clouds")
            clouds = None if clouds is None else {c.lower() for c in ([clouds] if isinstance(clouds, str) else clouds)}
            return {
                name: [
                    o
                    for o in offers
                    if o.accelerator_count == given.get("quantity_filter", o.accelerator_count)
                    and (clouds is None or o.cloud.lower() in clouds)
                ]
                for name, offers in self.catalog.items()
                if pattern.search(name)
            }

        monkeypatch.setattr(sky.catalog, "list_accelerators", list_accelerators)
        self._install_controller_catalog(monkeypatch)
        from sky.utils import annotations

        monkeypatch.setattr(annotations, "is_on_api_server", False)  # a client process (set by any real SDK call)
        import resources.cloud.network as network

        monkeypatch.setattr(network, "ssh_tunnel", self._tunnel)
        monkeypatch.setattr(sky, "get", self._get)
        monkeypatch.setattr(sky, "stream_and_get", self._get)
        for module, name, answer in (
            (sky, "launch", self._launch),
            (sky, "endpoints", self._endpoints),
            (sky, "down", self._down),
            (sky, "status", self._status),
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
                aws = dict(config.get("aws") or {})
                self.identities.append((real.__module__, aws.get("remote_identity")))
                self.security_groups.append(aws.get("security_group_name"))
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
        self.jobs.append(job(name, len(self.calls), "RUNNING"))
        return [len(self.calls)], None

    def reached(self, cluster: str) -> str:
        """Where this machine reaches `cluster`'s Redis."""
        return self.addresses.get(cluster, self.address)

    def _endpoints(self, cluster, port):
        if not self.cluster_exists:  # what sky.backends.backend_utils.get_endpoints raises for an unknown cluster
            raise sky_exceptions.ClusterNotUpError(f"Cluster {cluster!r} not found.", cluster_status=None)
        return {port: self.reached(cluster)}

    def _status(self, cluster_names, **options):
        """SkyPilot's StatusResponse with a real CloudVmRayResourceHandle: the node's cloud, region and its
        (private, public) address pair, one private address per cluster."""
        if not self.cluster_exists:
            return []
        return [cluster_record(name, self.region, private_ip(name)) for name in cluster_names or [] if name]

    @contextlib.contextmanager
    def _tunnel(self, cluster, port):
        """The stand-in for `ssh -L` to the node: this machine reaches its Redis at `reached(cluster)`."""
        self.tunnels.append(cluster)
        yield self.reached(cluster)

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
        self.jobs = [r.model_copy(update={"status": cancelled()}) if r.job_id in job_ids else r for r in self.jobs]

    def running(self) -> list[str]:
        """Names of the jobs the controller runs (not finished)."""
        return [r.job_name for r in self.jobs if not r.status.is_terminal()]

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


def private_ip(cluster: str) -> str:
    """The private address the stand-in gives `cluster`'s node (distinct per cluster)."""
    import zlib

    return f"10.0.{zlib.crc32(cluster.encode()) % 250}.7"


def cluster_record(name: str, region: str, private: str):
    """A cluster as `sky.status` returns it: SkyPilot's StatusResponse holding its CloudVmRayResourceHandle."""
    from sky.backends.cloud_vm_ray_backend import CloudVmRayResourceHandle
    from sky.schemas.api.responses import StatusResponse
    from sky.utils.status_lib import ClusterStatus

    import sky

    handle = CloudVmRayResourceHandle(
        cluster_name=name,
        cluster_name_on_cloud=f"{name}-2ea4",
        cluster_yaml=None,
        launched_nodes=1,
        launched_resources=sky.Resources(cloud=sky.AWS(), region=region, accelerators="L4:1"),
        stable_internal_external_ips=[(private, "3.80.1.2")],
    )
    return StatusResponse(
        name=name,
        launched_at=1,
        handle=handle,
        status=ClusterStatus.UP,
        autostop=10,
        to_down=True,
        cluster_hash="h",
        cluster_ever_up=True,
        user_hash="u",
        user_name="me",
        workspace="default",
        is_managed=False,
        nodes=1,
    )


def cancelled():
    from sky.jobs.state import ManagedJobStatus

    return ManagedJobStatus.CANCELLED


def offer(cloud: str, instance: str, gpu: str, count: int, price: float, spot_price: float):
    """One catalog row as sky.catalog.list_accelerators returns it."""
    from sky.catalog.common import InstanceTypeInfo

    return InstanceTypeInfo(cloud, instance, gpu, count, 8.0, 24.0, 32.0, price, spot_price, "us-east-1")


def job(name: str, job_id: int, status: str):
    """A managed job as `sky.jobs.queue_v2` returns it."""
    from sky.jobs.state import ManagedJobStatus
    from sky.schemas.api.responses import ManagedJobRecord

    return ManagedJobRecord(job_name=name, job_id=job_id, status=ManagedJobStatus[status])


@contextlib.contextmanager
def skypilot_config(**aws: Any):
    """SkyPilot's config (as ~/.sky/config.yaml would set it) with these `aws` keys, while the block runs."""
    from sky import skypilot_config as config_module

    config = config_module.to_dict()
    for key, value in aws.items():
        config.set_nested(("aws", key), value)
    with config_module.replace_skypilot_config(config):
        yield


@pytest.fixture
def fake_sky(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """SkyPilot's API server stood in for; SkyPilot's config names LOCAL_CREDENTIALS (this machine's keys, chosen
    there), so a launch with the default --aws-identity ships the keys."""
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    for name in ("SPOTLIGHT_REDIS_PASSWORD_FILE", "SPOTLIGHT_REWARD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPOTLIGHT_STATE_DIR", str(tmp_path / "state"))  # the run's TLS files: never in ~
    monkeypatch.setenv("SPOTLIGHT_REDIS_RUN_CA", "")  # restored after each test: launch and status set it
    with skypilot_config(remote_identity="LOCAL_CREDENTIALS"):
        yield FakeSky().install(monkeypatch)


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})  # one error line, unwrapped


@pytest.fixture
def reserved_redis(fake_sky, tmp_path, monkeypatch):
    """The default cluster's node Redis with the launch password; the fake node's address points at it."""
    import shutil

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    password = "node-pass-\"q'\\ 7"  # quotes, a backslash and a space: any character is allowed
    monkeypatch.setenv("SPOTLIGHT_REDIS_PASSWORD", password)
    node = start_node_redis("spotlight-reserved", tmp_path / "node-redis", password)
    fake_sky.address = f"127.0.0.1:{node.port}"
    yield node
    stop_node_redis(node)


def node_queue(node: NodeRedis, monkeypatch, client_cert: bool = False):
    """The coordinator's connection to the node's Redis (this process trusting the run's CA; with `client_cert`,
    showing a client certificate of it, for a mutual-TLS node)."""
    from resources.cloud import use_run_ca
    from resources.queue import open_queue

    for name in ("SPOTLIGHT_REDIS_RUN_CA", "SPOTLIGHT_REDIS_CLIENT_CERT", "SPOTLIGHT_REDIS_CLIENT_KEY"):
        monkeypatch.setenv(name, "")  # use_run_ca sets them in os.environ: undone after the test
    assert use_run_ca("spotlight-reserved", client_cert=client_cert)
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
