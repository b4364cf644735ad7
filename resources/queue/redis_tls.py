"""The reserved node's Redis locked to the run: TLS with the run's CA, an admin user, and an ACL file for the workers.

On the node, `python -m resources.queue.redis_tls --dir D --port P [--mutual-tls]` writes redis.conf and users.acl
(0600) and the certificate files from the environment (SkyPilot secrets), never from a command line:
- TLS only (`port 0`, `tls-port P`): nothing in clear text on the network. A private queue (the default: the
  workers reach the node on the cloud's private network) lets clients prove themselves with their ACL password
  inside TLS. A public queue runs with --mutual-tls: `tls-auth-clients yes`, so a client without a certificate
  signed by the run's CA (resources/queue/redis_certs.py) is cut off at the handshake, before any password.
- The `default` user (the coordinator, on the node) has every command, with SPOTLIGHT_REDIS_PASSWORD, stored as its
  SHA-256: the plain password is on no disk and any character is allowed.
- Each spot worker job has its own ACL user, granted and revoked at run time (resources/queue/redis_acl.py); the
  ACL file keeps them across a restart of Redis, and a relaunch of the node keeps the worker users it had.
The certificates themselves (the run's CA, the server's, the workers' client certificates) are made by
`spotlight launch` (resources/queue/redis_certs.py; re-exported here).

Example:
    conf = write_node_files(Path("runs/cloud/redis"), 6379, os.environ, mutual_tls=False)   # then redis-server conf
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import sys
from pathlib import Path
from typing import Mapping

from resources.queue.redis_acl import WORKER_PREFIX
from resources.queue.redis_certs import (
    CA_KEY_FILE,
    FILES,
    SERVER_NAME,
    RunTls,
    client_cert,
    make_run_tls,
    run_tls,
    write_private,
)
from resources.urls import PASSWORD_ENV, RUN_CA_ENV, redis_password

CERT_ENV = "SPOTLIGHT_REDIS_TLS_CERT"
"""The server's certificate (base64 of its PEM), a secret of the reserved node."""
KEY_ENV = "SPOTLIGHT_REDIS_TLS_KEY"
"""The server's private key (base64 of its PEM), a secret of the reserved node only."""
ACL_FILE = "users.acl"
"""The node's ACL file (0600): the default user and the worker users granted so far."""


def redis_conf(folder: Path, port: int, mutual_tls: bool = False) -> str:
    """redis.conf of the run's server: TLS only on `port`, client certificates required when `mutual_tls` (a
    public queue), users from the ACL file in `folder`."""
    return "\n".join(
        [
            "port 0",
            f"tls-port {port}",
            "bind 0.0.0.0 -::*",
            "protected-mode no",
            f"tls-cert-file {folder}/server.pem",
            f"tls-key-file {folder}/server.key",
            f"tls-ca-cert-file {folder}/ca.pem",
            # A public queue: no certificate of the run's CA, no connection. A private one: the ACL password is
            # the client's proof, inside TLS.
            f"tls-auth-clients {'yes' if mutual_tls else 'no'}",
            f"aclfile {folder}/{ACL_FILE}",
            "appendonly yes",
            f"dir {folder}",
            f"pidfile {folder}/redis.pid",
            f"logfile {folder}/redis.log",
            "daemonize yes",
            "",
        ]
    )


def acl_file(password: str, previous: str = "") -> str:
    """users.acl: the default user (every command, the coordinator's password as its SHA-256), then the worker users
    of `previous` (the file a last start of Redis left: workers still running keep their credential)."""
    digest = hashlib.sha256(password.encode()).hexdigest()
    workers = [line for line in previous.splitlines() if line.startswith(f"user {WORKER_PREFIX}")]
    return "\n".join([f"user default on #{digest} ~* &* +@all", *workers, ""])


def write_node_files(folder: Path, port: int, env: Mapping[str, str], mutual_tls: bool = False) -> Path:
    """redis.conf, users.acl and the certificate files in `folder`, from the node's secrets; ValueError naming a
    missing one."""
    password = redis_password(env)
    missing = [
        name
        for name, value in (
            (PASSWORD_ENV, password),
            (RUN_CA_ENV, env.get(RUN_CA_ENV)),
            (CERT_ENV, env.get(CERT_ENV)),
            (KEY_ENV, env.get(KEY_ENV)),
        )
        if not value
    ]
    if missing or password is None:
        raise ValueError(f"the reserved node lacks {', '.join(missing)} (set by spotlight launch as secrets)")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name, variable in zip(FILES, (RUN_CA_ENV, CERT_ENV, KEY_ENV), strict=True):
        write_private(folder / name, base64.b64decode(env[variable], validate=True))
    users = folder / ACL_FILE
    write_private(users, acl_file(password, users.read_text() if users.is_file() else "").encode())
    write_private(folder / "redis.conf", redis_conf(folder.resolve(), port, mutual_tls).encode())
    return folder / "redis.conf"


def main(argv: list[str] | None = None) -> int:
    """Write the reserved node's redis.conf, ACL file and TLS files from its secrets; exit 2 saying what is missing."""
    parser = argparse.ArgumentParser(prog="python -m resources.queue.redis_tls", description=main.__doc__.split(";")[0])
    parser.add_argument("--dir", type=Path, required=True, help="Redis's folder (data, config, certificates).")
    parser.add_argument("--port", type=int, required=True, help="The TLS port Redis listens on.")
    parser.add_argument(
        "--mutual-tls",
        action="store_true",
        help="Require a client certificate signed by the run's CA (a queue on a public port).",
    )
    args = parser.parse_args(argv)
    try:
        print(write_node_files(args.dir, args.port, dict(os.environ), args.mutual_tls))
    except ValueError as err:
        print(f"resources.queue.redis_tls: {err}", file=sys.stderr)
        return 2
    return 0


__all__ = [
    "ACL_FILE",
    "CA_KEY_FILE",
    "CERT_ENV",
    "FILES",
    "KEY_ENV",
    "SERVER_NAME",
    "RunTls",
    "acl_file",
    "client_cert",
    "make_run_tls",
    "redis_conf",
    "run_tls",
    "write_node_files",
]

if __name__ == "__main__":
    sys.exit(main())
