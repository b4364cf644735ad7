"""The queue off the internet: by default no port of the reserved node is opened (SkyPilot's `ports:` means
0.0.0.0/0); the spot workers start in the node's region and security group and reach its private address, and this
machine reaches its Redis through an SSH tunnel (stood in for). `--public-queue` opens the port, with mutual TLS."""

from __future__ import annotations

import base64

import pytest

from tests.paths import REPO_ROOT
from tests.pipelines.sky_fakes import SECRETS, launch_plan, private_ip, served_task
from tests.pipelines.sky_fakes import invoke as _invoke

CLIENT = ("SPOTLIGHT_REDIS_CLIENT_CERT", "SPOTLIGHT_REDIS_CLIENT_KEY")


def test_the_reserved_yaml_opens_no_port() -> None:
    import sky

    (resources,) = sky.Task.from_yaml(str(REPO_ROOT / "sky" / "reserved.yaml")).resources
    assert not resources.ports


def test_by_default_workers_reach_the_nodes_private_address_in_its_region_and_security_group(
    fake_sky, reserved_redis
) -> None:
    result = _invoke("launch", "--spot-workers", "2", "--store", "s3://b/p")
    assert result.exit_code == 0, result.output
    (reserved, _), _ = fake_sky.calls[0][1:]
    (resources,) = reserved.resources
    assert not resources.ports and reserved.envs["REDIS_MUTUAL_TLS"] == "no"
    assert fake_sky.tunnels == ["spotlight-reserved"]  # this machine reached Redis through SSH, not an open port
    assert fake_sky.security_groups == ["spotlight-spotlight-reserved"] * 3  # every node in one group
    workers = [task for name, (task, _), _ in fake_sky.calls if name == "jobs.launch"]
    assert len(workers) == 2
    for task in workers:
        user = task.envs["SPOTLIGHT_QUEUE"].split("//")[1].split("@")[0]  # the job's own ACL user
        assert user.startswith("spotlight-w") and task.envs["SPOTLIGHT_QUEUE"] == (
            f"rediss://{user}@{private_ip('spotlight-reserved')}:6379/0"
        )
        assert {(str(r.cloud), r.region) for r in task.resources} == {("AWS", fake_sky.region)}
        assert len(task.resources) == 4  # the YAML's any_of, each pinned to the node's region
        assert not {"SPOTLIGHT_REDIS_CLIENT_CERT", "SPOTLIGHT_REDIS_CLIENT_KEY"} & set(task.secrets)


def test_a_public_queue_opens_the_port_with_mutual_tls_and_its_workers_show_a_client_certificate(tmp_path) -> None:
    from cryptography import x509

    import sky
    from resources.cloud import NodePlace, plan_tasks, ship_run_config, with_run_tls
    from resources.cloud.network import skypilot_config_overrides
    from resources.queue.redis_tls import make_run_tls

    plan = launch_plan(spot_workers=1, public_queue=True)
    tls = make_run_tls()
    secrets = with_run_tls(SECRETS, tls)  # the launcher holds the run's CA key: it signs the workers' certificate
    place = NodePlace(sky.AWS(), "us-east-2", "10.0.0.7", "3.80.1.2")
    reserved, worker = plan_tasks(
        plan, secrets, ship_run_config(plan, tmp_path), "rediss://w@3.80.1.2:6379/0", 0.5, place
    )
    reserved, worker = served_task(reserved), served_task(worker)
    assert [list(r.ports or []) for r in reserved.resources] == [["6379"]]
    assert reserved.envs["REDIS_MUTUAL_TLS"] == "yes"
    shown = x509.load_pem_x509_certificate(base64.b64decode(worker.secrets[CLIENT[0]].get_secret_value()))
    shown.verify_directly_issued_by(x509.load_pem_x509_certificate(tls.ca_pem))  # raises unless the run's CA signed it
    assert "PRIVATE KEY" in base64.b64decode(worker.secrets[CLIENT[1]].get_secret_value()).decode()
    assert not set(CLIENT) & set(reserved.secrets)  # the node holds the server's key, not a client's
    assert {r.region for r in worker.resources} == {None}  # any region: it reaches the public endpoint
    assert "security_group_name" not in skypilot_config_overrides(plan).get("aws", {})  # SkyPilot's own, opened


def test_a_public_queue_without_client_certificates_is_refused_before_anything_is_submitted(tmp_path) -> None:
    """No TLS at all, or a run's TLS files whose CA key this machine did not keep: no certificate can be signed."""
    import dataclasses

    from resources.cloud import CloudError, plan_tasks, ship_run_config, with_run_tls
    from resources.queue.redis_tls import make_run_tls

    plan = launch_plan(spot_workers=1, public_queue=True)
    old_run = with_run_tls(SECRETS, dataclasses.replace(make_run_tls(), ca_key_pem=None))
    for secrets in (SECRETS, old_run):
        with pytest.raises(CloudError, match="--public-queue needs the workers' client certificate"):
            plan_tasks(plan, secrets, ship_run_config(plan, tmp_path))


_SSH = """#!{python}
# A stand-in for `ssh -N -L 127.0.0.1:LOCAL:HOST:PORT CLUSTER` on one machine: it records its argv and forwards
# each connection to LOCAL on to HOST:PORT (here), as ssh forwards it to the node's own address.
import socket, sys, threading
open({log!r}, "a").write(" ".join(sys.argv[1:]) + "\\n")
if "fail" in sys.argv[-1]:
    sys.exit("Permission denied (publickey).")
_, local, host, port = sys.argv[sys.argv.index("-L") + 1].rsplit(":", 3)
listener = socket.create_server(("127.0.0.1", int(local)))
def pipe(a, b):
    while data := a.recv(65536):
        b.sendall(data)
    b.close()
while True:
    client, _ = listener.accept()
    upstream = socket.create_connection((host, int(port)))
    threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
    threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()
"""


def test_the_ssh_tunnel_forwards_to_the_nodes_own_port_and_is_closed_afterwards(tmp_path, monkeypatch) -> None:
    import socket
    import sys

    from resources.cloud import CloudError
    from resources.cloud.network import ssh_tunnel

    (tmp_path / "ssh").write_text(_SSH.format(python=sys.executable, log=str(tmp_path / "ssh.log")))
    (tmp_path / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    node = socket.create_server(("127.0.0.1", 0))  # the node's Redis port, reachable only through the tunnel
    with ssh_tunnel("run-a", node.getsockname()[1]) as address:
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as client:
            client.sendall(b"PING\r\n")
            node.settimeout(10)
            received = []
            while not received or received[-1] == b"":  # the first may be the tunnel's own readiness probe
                accepted, _ = node.accept()
                received.append(accepted.recv(16))
                accepted.close()
            assert received[-1] == b"PING\r\n"
    with pytest.raises(OSError):  # the tunnel's process is gone with the block
        socket.create_connection((host, int(port)), timeout=2).close()
    argv = (tmp_path / "ssh.log").read_text().split()
    assert argv[-1] == "run-a" and "BatchMode=yes" in argv and "ExitOnForwardFailure=yes" in argv
    with pytest.raises(CloudError, match=r"the SSH tunnel to fail-node failed \(Permission denied"):
        with ssh_tunnel("fail-node", 6379):
            pass


def test_a_tunnel_whose_ssh_ignores_sigterm_is_killed_and_the_blocks_error_is_the_one_raised(
    tmp_path, monkeypatch
) -> None:
    import sys

    from resources.cloud import network

    (tmp_path / "ssh").write_text(
        _SSH.format(python=sys.executable, log=str(tmp_path / "ssh.log")).replace(
            "import socket, sys, threading\n",
            "import signal, socket, sys, threading\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n",
        )
    )
    (tmp_path / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    monkeypatch.setattr(network, "TUNNEL_STOP_S", 0.5)
    with pytest.raises(KeyError, match="the block's own"):
        with network.ssh_tunnel("run-a", 6379):
            raise KeyError("the block's own")
