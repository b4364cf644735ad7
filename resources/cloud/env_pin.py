"""The environment cache pinned by the launcher: only the reserved node can sign a cached venv, every node restores
only an archive that signature checks, and no spot worker saves one.

Every node holds keys that can write the run's bucket, where sky/setup.sh caches the venv (env-KEY.tar), so a
compromised spot VM could plant a venv that the next node, the reserved one included, would run. `spotlight launch`
therefore makes a signing key for the run (kept 0600 on this machine beside the run's TLS files, so a relaunch reuses
it): the private half is a secret of the reserved node alone (ENV_SIGNING_KEY_ENV), the public half goes to every node
as a plain variable (ENV_VERIFY_KEY_ENV). sky/setup.sh copies an archive to local disk, checks its signature
(env-KEY.tar.sig, ECDSA P-256 over SHA-256, `openssl dgst -verify`) against the launcher's public key, and unpacks
only that checked copy; a node without the signing key never writes the cache. A worker can still delete or spoil
the cache (the next node then installs), not put code on another node.

Example:
    pin = env_signing(tls_folder(cluster).parent / "env-signing")
    secrets = with_env_signing(secrets, pin)             # the reserved node's secret and every node's variable
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

ENV_SIGNING_KEY_ENV = "SPOTLIGHT_ENV_SIGNING_KEY"
"""The reserved node's private key (base64 PEM) that signs the venv it caches; a secret of that node only."""
ENV_VERIFY_KEY_ENV = "SPOTLIGHT_ENV_VERIFY_KEY"
"""The launcher's public key (base64 PEM): every node restores only an archive it verifies. Public: an env."""
FILES = ("signing.key", "verify.pem")


@dataclass(frozen=True)
class EnvSigning:
    """A run's env-cache signing key pair (PEM bytes)."""

    verify_pem: bytes
    signing_pem: bytes = field(repr=False)

    def b64(self, name: str) -> str:
        """verify_pem or signing_pem as one line of base64 (an environment variable's value)."""
        return base64.b64encode(getattr(self, name)).decode("ascii")


def make_env_signing() -> EnvSigning:
    """A fresh ECDSA P-256 key pair."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    signing = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    verify = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return EnvSigning(verify, signing)


def env_signing(folder: Path) -> EnvSigning:
    """The run's key pair in `folder` (0700, files 0600), made there the first time: a relaunch keeps it, so the
    cache its reserved node signed stays usable."""
    if all((folder / name).is_file() for name in FILES):
        return EnvSigning(verify_pem=(folder / FILES[1]).read_bytes(), signing_pem=(folder / FILES[0]).read_bytes())
    pin = make_env_signing()
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(folder, 0o700)
    for name, data in zip(FILES, (pin.signing_pem, pin.verify_pem), strict=True):
        fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
    return pin


def with_env_signing(secrets: Mapping[str, str], pin: EnvSigning) -> dict[str, str]:
    """The launch secrets plus the signing key (the reserved node's) and the verify key (everyone's): each task takes
    only the names its YAML declares."""
    return {**secrets, ENV_SIGNING_KEY_ENV: pin.b64("signing_pem"), ENV_VERIFY_KEY_ENV: pin.b64("verify_pem")}
