"""What the reward-serve tests need around a server: a thread to run it in, hostile clients, big PNGs, a test CA."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import socket
import struct
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path


@contextlib.contextmanager
def serving(server):
    """Run a RewardServer on a thread (its socket already listens) and stop it afterwards."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@dataclass
class Trickle:
    """A client that sends `head`, then `tail` one byte every `every_s`; what the server sent it and when it closed."""

    port: int
    head: bytes
    tail: bytes
    every_s: float = 0.3
    received: bytes = b""
    closed_after_s: float | None = None
    started: float = field(default_factory=time.monotonic)

    def run(self, give_up_s: float = 15.0) -> None:
        # Stamped before connecting: the server's clock starts at accept, which can come before a stamp taken after
        # connect returns (a descheduled client thread read 0.999 s for a 1 s cut in CI).
        self.started = time.monotonic()
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        try:
            sock.sendall(self.head)
            sock.settimeout(self.every_s)
            for i in range(len(self.tail)):
                if time.monotonic() - self.started > give_up_s or self._read_closed(sock):
                    return
                try:
                    sock.sendall(self.tail[i : i + 1])
                except OSError:  # the server cut it: read what it said first
                    self._read_closed(sock, drain=True)
                    return
            self._read_closed(sock, drain=True)
        finally:
            sock.close()

    def _read_closed(self, sock: socket.socket, drain: bool = False) -> bool:
        """Read what is there (until the close, with drain); True once the server has closed the connection."""
        sock.settimeout(5.0 if drain else self.every_s)
        try:
            while chunk := sock.recv(65536):
                self.received += chunk
        except TimeoutError:
            return False
        except OSError:  # a reset after the answer: closed all the same
            pass
        self.closed_after_s = time.monotonic() - self.started
        return True


def start_all(clients: list[Trickle]) -> list[threading.Thread]:
    threads = [threading.Thread(target=c.run, daemon=True) for c in clients]
    for thread in threads:
        thread.start()
    return threads


def png_of_zeros(width: int, height: int) -> bytes:
    """A valid black RGB PNG, built row by row (never the whole image in memory): small on the wire, large decoded."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer, row = zlib.compressobj(9), b"\0" * (1 + 3 * width)
    idat = b"".join(packer.compress(row) for _ in range(height)) + packer.flush()
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def make_test_ca(folder: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate for 127.0.0.1, its key at 0600), written to `folder` as PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "reward-serve test CA")])

    def build(subject, public_key, extension, critical):
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(extension, critical=critical)
            .sign(ca_key, hashes.SHA256())
        )

    ca = build(ca_name, ca_key.public_key(), x509.BasicConstraints(ca=True, path_length=0), True)
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = build(server_name, key.public_key(), san, False)
    pem = serialization.Encoding.PEM
    paths = folder / "ca.pem", folder / "server.pem", folder / "server.key"
    paths[0].write_bytes(ca.public_bytes(pem))
    paths[1].write_bytes(cert.public_bytes(pem))
    paths[2].write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


def recording_loads(real_load, loads: list[int]):
    """ImageFile.load, noting the width of each image whose pixels it is about to decode (tiles still pending)."""

    def load(image):
        if image.tile:
            loads.append(image.width)
        return real_load(image)

    return load
