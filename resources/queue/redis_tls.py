"""The reserved node's Redis locked to the run: TLS with a per-run CA, and an ACL user for the spot workers.

`spotlight launch` makes a CA for the run alone and the Redis server's certificate signed by it
(`run_tls`, kept 0600 on the launching machine so a relaunch reuses them); the CA's key is not
kept: it signs one certificate and is thrown away, so a client that trusts the run's CA trusts
that one server and nothing else. The node's address is not known when the certificate is made,
so clients check the chain, not the host name (resources/urls.py, SPOTLIGHT_REDIS_RUN_CA).

On the node, `python -m resources.queue.redis_tls --dir D --port P` writes redis.conf (0600) and
the certificate files from the environment (SkyPilot secrets), never from a command line:
- TLS only (`port 0`, `tls-port P`): nothing in clear text on the network.
- The `default` user (the coordinator, on the node) has every command, with SPOTLIGHT_REDIS_PASSWORD;
  stored as its SHA-256, so the plain password is on no disk and any character is allowed.
- The `spotlight-worker` user (every spot worker) has the queue's keys only (`spotlight:*`) and the
  commands the queue uses: reads, writes, streams, scripts; no CONFIG, MODULE, FLUSHALL, KEYS, DEBUG,
  ACL, SHUTDOWN (-@admin -@dangerous). Its password is an HMAC of the coordinator's, so it reveals
  nothing of it and a relaunch derives the same one.

Example:
    tls = run_tls(Path("~/.spotlight/spotlight-reserved").expanduser())      # at launch
    worker_secret = worker_password(coordinator_password)
"""

from __future__ import annotations

import argparse
import base64
import datetime
import hashlib
import hmac
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from resources.urls import PASSWORD_ENV, RUN_CA_ENV, redis_password

SERVER_NAME = "spotlight-redis"
"""The name in the run's server certificate; clients check it instead of the node's address (unknown at launch)."""
WORKER_USER = "spotlight-worker"
"""The ACL user of the spot workers (their queue URL: rediss://spotlight-worker@HOST:PORT/0)."""
WORKER_RULES = (
    "~spotlight:* resetchannels -@all +@read +@write +@stream +@scripting +@connection +time"
    " -@admin -@dangerous -function -script|flush -script|kill"
)
"""What a worker may do: the queue's keys, its commands, nothing that reconfigures, empties or lists the server."""
CERT_ENV = "SPOTLIGHT_REDIS_TLS_CERT"
"""The server's certificate (base64 of its PEM), a secret of the reserved node."""
KEY_ENV = "SPOTLIGHT_REDIS_TLS_KEY"
"""The server's private key (base64 of its PEM), a secret of the reserved node only."""
FILES = ("ca.pem", "server.pem", "server.key")


@dataclass(frozen=True)
class RunTls:
    """A run's CA certificate and its Redis server's certificate and key (PEM bytes)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes = field(repr=False)

    def b64(self, name: str) -> str:
        """One of ca_pem / cert_pem / key_pem as one line of base64 (an environment variable's value)."""
        return base64.b64encode(getattr(self, name)).decode("ascii")


def make_run_tls(days: int = 365) -> RunTls:
    """A fresh CA (its key dropped once it has signed) and a server certificate for SERVER_NAME."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"spotlight run CA {os.urandom(6).hex()}")])
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, SERVER_NAME)])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        x509.CertificateBuilder()
        .subject_name(server_name)
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(SERVER_NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = server_key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return RunTls(ca.public_bytes(pem), server.public_bytes(pem), key_pem)


def run_tls(folder: Path) -> RunTls:
    """The run's TLS files in `folder` (0700; files 0600), made there the first time: a relaunch keeps them, so
    workers still running trust the restarted server."""
    if all((folder / name).is_file() for name in FILES):
        return RunTls(*((folder / name).read_bytes() for name in FILES))
    tls = make_run_tls()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    for name, data in zip(FILES, (tls.ca_pem, tls.cert_pem, tls.key_pem), strict=False):
        _write_private(folder / name, data)
    return tls


def worker_password(password: str) -> str:
    """The spot workers' password, derived from the coordinator's: it opens only the worker user."""
    return hmac.new(password.encode(), b"spotlight-worker/redis-acl", hashlib.sha256).hexdigest()


def redis_conf(folder: Path, port: int, password: str) -> str:
    """redis.conf of the run's server: TLS only on `port`, the default user and the worker user (hashed passwords)."""
    sha = hashlib.sha256
    return "\n".join(
        [
            "port 0",
            f"tls-port {port}",
            "bind 0.0.0.0 -::*",
            "protected-mode no",
            f"tls-cert-file {folder}/server.pem",
            f"tls-key-file {folder}/server.key",
            f"tls-ca-cert-file {folder}/ca.pem",
            "tls-auth-clients no",  # clients prove themselves with their ACL password, inside TLS
            f"user default on #{sha(password.encode()).hexdigest()} ~* &* +@all",
            f"user {WORKER_USER} on #{sha(worker_password(password).encode()).hexdigest()} {WORKER_RULES}",
            "appendonly yes",
            f"dir {folder}",
            f"pidfile {folder}/redis.pid",
            f"logfile {folder}/redis.log",
            "daemonize yes",
            "",
        ]
    )


def write_node_files(folder: Path, port: int, env: dict[str, str]) -> Path:
    """redis.conf and the certificate files in `folder`, from the node's secrets; ValueError naming a missing one."""
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
    if missing:
        raise ValueError(f"the reserved node lacks {', '.join(missing)} (set by spotlight launch as secrets)")
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    for name, variable in zip(FILES, (RUN_CA_ENV, CERT_ENV, KEY_ENV), strict=False):
        _write_private(folder / name, base64.b64decode(env[variable], validate=True))
    _write_private(folder / "redis.conf", redis_conf(folder.resolve(), port, password).encode())
    return folder / "redis.conf"


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def main(argv: list[str] | None = None) -> int:
    """Write the reserved node's redis.conf and TLS files from its secrets; exit 2 saying what is missing."""
    parser = argparse.ArgumentParser(prog="python -m resources.queue.redis_tls", description=main.__doc__.split(";")[0])
    parser.add_argument("--dir", type=Path, required=True, help="Redis's folder (data, config, certificates).")
    parser.add_argument("--port", type=int, required=True, help="The TLS port Redis listens on.")
    args = parser.parse_args(argv)
    try:
        print(write_node_files(args.dir, args.port, dict(os.environ)))
    except ValueError as err:
        print(f"resources.queue.redis_tls: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
