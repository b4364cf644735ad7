"""How the spot workers and this machine reach the reserved node's Redis: on its private address by default, the port
opened to the internet only for a launch with `public_queue` (then with mutual TLS).

SkyPilot's `ports:` opens a port to 0.0.0.0/0, so the private default opens none. Instead every node of the run is put
in one AWS security group, `run_security_group(cluster)` (SkyPilot's `aws.security_group_name`, carried by each
launch request to the API server and by the jobs controller to each job's VM): SkyPilot gives the group it makes a
rule that admits all traffic between its members, and SSH. The spot jobs are pinned to the reserved node's cloud and
region (one VPC), and their queue is the node's private IP from SkyPilot's cluster record (`node_place`). This
machine is outside that network: it reaches the Redis through an SSH tunnel to the node (`launcher_route`; SkyPilot
writes the node's SSH config). On other clouds the VPC SkyPilot uses must admit traffic between its VMs (GCP's
`skypilot-vpc` does); that is not checked here.

Example:
    with skypilot_overrides(plan):
        sky.stream_and_get(sky.launch(task, cluster_name=plan.cluster))
    place = node_place(plan.cluster)                    # cloud, region, private and public IP
    with launcher_route(plan.cluster, plan.public_queue) as address:   # 127.0.0.1:PORT (a tunnel), or the public one
        ...
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from dataclasses import dataclass
from typing import Any, Iterator

import sky
from resources.cloud.plan import CloudError, LaunchPlan, configured_aws_identity
from resources.processes import stop_process
from sky import exceptions as sky_exceptions

REDIS_PORT = 6379
TUNNEL_WAIT_S = 60.0
"""How long this machine waits for its SSH tunnel to the node to accept connections."""
TUNNEL_STOP_S = 5.0
"""How long a tunnel's ssh gets to exit on SIGTERM before it is killed."""


@dataclass(frozen=True)
class NodePlace:
    """Where the reserved node runs, from SkyPilot's record of its cluster."""

    cloud: Any
    """SkyPilot's cloud object (sky.AWS(), ...)."""
    region: str | None
    private_ip: str
    public_ip: str | None

    @property
    def infra(self) -> str:
        """SkyPilot's `--infra` for the node's cloud and region (aws/us-east-1)."""
        return f"{str(self.cloud).lower()}/{self.region}" if self.region else str(self.cloud).lower()


def run_security_group(cluster: str) -> str:
    """The AWS security group every node of a private-queue run shares (admitting traffic between its members)."""
    return f"spotlight-{cluster}"


def skypilot_config_overrides(plan: LaunchPlan) -> dict[str, Any]:
    """SkyPilot config keys a launch sets on every request: the nodes' instance role, and a private queue's shared
    security group (a public queue's node gets SkyPilot's own group, the only one whose ports it opens)."""
    aws: dict[str, Any] = {}
    if plan.remote_identity is not None:
        aws["remote_identity"] = plan.remote_identity
    if not plan.public_queue:
        aws["security_group_name"] = run_security_group(plan.cluster)
    return {"aws": aws} if aws else {}


@contextlib.contextmanager
def skypilot_overrides(plan: LaunchPlan) -> Iterator[None]:
    """SkyPilot's config with `skypilot_config_overrides` laid over it while launching: every request carries them to
    the API server, so the reserved node, the jobs controller and each spot job's VM get them."""
    overrides = skypilot_config_overrides(plan)
    if not overrides:
        yield
        return
    from sky import skypilot_config

    config = skypilot_config.to_dict()
    for cloud, keys in overrides.items():
        for key, value in keys.items():
            config.set_nested((cloud, key), value)
    with skypilot_config.replace_skypilot_config(config):
        yield


def configured_identity() -> str | None:
    """The --aws-identity SkyPilot's config names (aws.remote_identity; plan.configured_aws_identity), or None."""
    from sky import skypilot_config

    return configured_aws_identity(skypilot_config.get_nested(("aws", "remote_identity"), None))


def node_place(cluster: str) -> NodePlace:
    """The reserved node's cloud, region and addresses from `sky.status`; CloudError when it is not up."""
    from resources.cloud.jobs import API_FAILURES

    try:
        records = sky.get(sky.status(cluster_names=[cluster]))
    except API_FAILURES as err:
        raise CloudError(
            f"cannot ask SkyPilot for the reserved node {cluster!r} ({err}); is its API server up?"
        ) from None
    handle = next((r.handle for r in records if r.name == cluster), None)
    ips = getattr(handle, "stable_internal_external_ips", None)
    if handle is None or not ips:
        raise CloudError(f"cannot find the reserved node {cluster!r}; is it up? (`sky status {cluster}`)")
    resources = handle.launched_resources
    private_ip, public_ip = ips[0]
    return NodePlace(resources.cloud, resources.region, private_ip, public_ip)


def public_endpoint(cluster: str) -> str:
    """host:port of the node's Redis port as SkyPilot opened it (a public queue); CloudError when it is not open."""
    from resources.cloud.jobs import API_FAILURES

    try:
        endpoints = sky.get(sky.endpoints(cluster, REDIS_PORT))
    except (sky_exceptions.ClusterNotUpError, sky_exceptions.ClusterDoesNotExist, *API_FAILURES) as err:
        raise CloudError(f"cannot find the reserved node {cluster!r} ({err}); is it up? (`sky status`)") from None
    if not endpoints:
        raise CloudError(
            f"the reserved node {cluster!r} exposes no port {REDIS_PORT}: it was launched with a private queue "
            "(relaunch with --public-queue to open it)"
        )
    return str(next(iter(endpoints.values())))


def worker_queue_host(plan: LaunchPlan, place: NodePlace) -> str:
    """host:port the spot workers' queue URL names: the node's private address, or its public endpoint."""
    return public_endpoint(plan.cluster) if plan.public_queue else f"{place.private_ip}:{REDIS_PORT}"


@contextlib.contextmanager
def launcher_route(cluster: str, public: bool) -> Iterator[str]:
    """host:port where this machine reaches the node's Redis while the block runs: the public endpoint of a public
    queue, else an SSH tunnel to the node's own 127.0.0.1 (the port is open to nobody else)."""
    if public:
        yield public_endpoint(cluster)
        return
    with ssh_tunnel(cluster, REDIS_PORT) as address:
        yield address


@contextlib.contextmanager
def ssh_tunnel(cluster: str, port: int) -> Iterator[str]:
    """`ssh -N -L` to the node (SkyPilot's SSH config names it after its cluster): 127.0.0.1:LOCAL forwards to the
    node's 127.0.0.1:`port`; CloudError when ssh fails or the tunnel does not open in TUNNEL_WAIT_S."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        local = probe.getsockname()[1]
    argv = ["ssh", "-N", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes", "-o", "ServerAliveInterval=15"]
    argv += ["-L", f"127.0.0.1:{local}:127.0.0.1:{port}", cluster]
    try:
        tunnel = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    except FileNotFoundError:
        raise CloudError("ssh is not installed here: a private queue is reached through an SSH tunnel") from None
    try:
        _wait_for_tunnel(tunnel, local, cluster)
        yield f"127.0.0.1:{local}"
    finally:
        stop_process(tunnel, TUNNEL_STOP_S)  # SIGKILL if ssh has not gone in TUNNEL_STOP_S


def _wait_for_tunnel(tunnel: subprocess.Popen, local: int, cluster: str) -> None:
    deadline = time.monotonic() + TUNNEL_WAIT_S
    while time.monotonic() < deadline:
        if tunnel.poll() is not None:
            why = (tunnel.stderr.read() if tunnel.stderr else b"").decode(errors="replace").strip()
            raise CloudError(f"the SSH tunnel to {cluster} failed ({why or tunnel.returncode}); try `ssh {cluster}`")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", local)) == 0:
                return
        time.sleep(0.2)
    raise CloudError(f"the SSH tunnel to {cluster} did not open within {TUNNEL_WAIT_S:g} s; try `ssh {cluster}`")
