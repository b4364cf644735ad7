"""The run's certificates: its own CA, the Redis server's certificate, and a client certificate per worker job.

`spotlight launch` makes them once per run (`run_tls`, files 0600 in a 0700 folder on the launching machine, so a
relaunch reuses them). The CA's key stays there: it signs the server's certificate and, for a public queue (mutual
TLS), one client certificate per worker job (`client_cert`); no node ever holds it, so no node can mint a
certificate. A client that trusts the run's CA trusts the run's server and nothing else.

Example:
    tls = run_tls(folder)                                      # at launch
    cert_pem, key_pem = client_cert(tls, "spotlight-w3-5f1c2a9b04de")
"""

from __future__ import annotations

import base64
import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SERVER_NAME = "spotlight-redis"
"""The name in the run's server certificate; clients check it instead of the node's address (unknown at launch)."""
FILES = ("ca.pem", "server.pem", "server.key")
CA_KEY_FILE = "ca.key"
"""The CA's private key, on the launching machine only (0600): it signs the workers' client certificates."""


@dataclass(frozen=True)
class RunTls:
    """A run's CA certificate, its Redis server's certificate and key, and the CA's key (PEM bytes; the CA's key
    None for a run made before it was kept: then no client certificate can be signed)."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    ca_key_pem: bytes | None = field(default=None, repr=False)

    def b64(self, name: str) -> str:
        """One of ca_pem / cert_pem / key_pem as one line of base64 (an environment variable's value)."""
        return base64.b64encode(getattr(self, name)).decode("ascii")


def _name(common_name: str) -> Any:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _signed(subject: str, public_key: Any, issuer: Any, issuer_key: Any, days: int, usage: list[Any]) -> Any:
    """A leaf certificate for `subject`, signed by `issuer_key`, with the extended key usages `usage`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(subject)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usage), critical=False)
    )
    return builder.sign(issuer_key, hashes.SHA256())


def _ca(days: int) -> tuple[Any, Any]:
    """A fresh self-signed CA that may sign leaves only: (certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"spotlight run CA {os.urandom(6).hex()}")
    usage = x509.KeyUsage(
        digital_signature=False,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage, critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _pem(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def make_run_tls(days: int = 365) -> RunTls:
    """A fresh CA and a certificate for SERVER_NAME signed by it. The server's certificate may also serve as a
    client's (the coordinator on the node presents it when Redis asks for client certificates)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    ca, ca_key = _ca(days)
    server_key = ec.generate_private_key(ec.SECP256R1())
    usage = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    server = _signed(SERVER_NAME, server_key.public_key(), ca.subject, ca_key, days, usage)
    pem = serialization.Encoding.PEM
    return RunTls(ca.public_bytes(pem), server.public_bytes(pem), _pem(server_key), _pem(ca_key))


def client_cert(tls: RunTls, name: str, days: int = 365) -> tuple[bytes, bytes]:
    """A client certificate for `name` (a worker job's ACL user) signed by the run's CA: (certificate, key) PEM.
    ValueError when the run's CA key was not kept (a run made before it was: relaunch it with a fresh state
    folder)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    if tls.ca_key_pem is None:
        raise ValueError(
            f"the run's CA key ({CA_KEY_FILE}) is not on this machine, so no client certificate can be signed for "
            f"{name}: mutual TLS needs a run whose TLS files were made by this version of spotlight launch"
        )
    ca = x509.load_pem_x509_certificate(tls.ca_pem)
    ca_key = serialization.load_pem_private_key(tls.ca_key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _signed(name, key.public_key(), ca.subject, ca_key, days, [ExtendedKeyUsageOID.CLIENT_AUTH])
    return cert.public_bytes(serialization.Encoding.PEM), _pem(key)


def run_tls(folder: Path) -> RunTls:
    """The run's TLS files in `folder` (0700; files 0600), made there the first time: a relaunch keeps them, so
    workers still running trust the restarted server."""
    if all((folder / name).is_file() for name in FILES):
        ca_key = folder / CA_KEY_FILE
        return RunTls(
            *((folder / name).read_bytes() for name in FILES), ca_key.read_bytes() if ca_key.is_file() else None
        )
    tls = make_run_tls()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    for name, data in zip((*FILES, CA_KEY_FILE), (tls.ca_pem, tls.cert_pem, tls.key_pem, tls.ca_key_pem), strict=True):
        assert data is not None
        write_private(folder / name, data)
    return tls


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path`, readable and writable by this user only (0600, also when it existed)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
