"""URL helpers shared by the store and queue URL parsers, and where a Redis queue lives (with its password)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import unquote, urlparse, urlsplit, urlunsplit

PASSWORD_ENV = "SPOTLIGHT_REDIS_PASSWORD"
"""Environment variable holding the Redis password (SkyPilot's `secrets:` set it on the node)."""
PASSWORD_FILE_ENV = "SPOTLIGHT_REDIS_PASSWORD_FILE"
"""Environment variable naming a file whose first line is the Redis password (a mounted secret)."""
CA_FILE_ENV = "SPOTLIGHT_REDIS_CA_FILE"
"""rediss:// only: a PEM bundle to trust instead of the system's CAs (a self-signed server)."""
RUN_CA_ENV = "SPOTLIGHT_REDIS_RUN_CA"
"""rediss:// only: the run's own CA (base64 of its PEM, made by `spotlight launch`), which signed the run's Redis
certificate and nothing else: the chain is checked against it, the host name is not (resources/queue/redis_tls.py)."""
CLIENT_CERT_ENV = "SPOTLIGHT_REDIS_CLIENT_CERT"
"""rediss:// with the run's CA: this client's certificate (base64 of its PEM), for a queue that requires one (mutual
TLS, a public queue); a worker job's is signed for it at launch (resources/queue/redis_certs.py)."""
CLIENT_KEY_ENV = "SPOTLIGHT_REDIS_CLIENT_KEY"
"""The private key of SPOTLIGHT_REDIS_CLIENT_CERT (base64 of its PEM), a secret."""
REDIS_SCHEMES = ("redis", "rediss")


def is_plain_path(text: str, scheme: str) -> bool:
    """True for a URL that is a plain path: no scheme, or a Windows drive letter (C:\\ or C:/)."""
    return scheme == "" or (len(scheme) == 1 and text[1:3] in (":\\", ":/"))


def absolute_url(url: str | Path) -> str:
    """A relative local path made absolute against this process's working directory; anything else unchanged.

    Call it before a path crosses a process boundary (a command line, a config file): a
    child started in another directory would read a relative path against its own. URLs with a
    scheme (redis://, rediss://, s3://, and sqlite:/// or file:/// which must already be absolute)
    and Windows drive paths pass through as they are; bad ones are left for the parsers to refuse.
    """
    text = str(url)
    if not text or urlparse(text).scheme != "":
        return text
    return str(Path(text).expanduser().resolve())


@dataclass(frozen=True)
class RedisAddress:
    """Where a Redis queue lives; the password is kept out of repr and the URL."""

    host: str
    port: int
    db: int
    username: str | None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    """rediss://: TLS to the server, its certificate checked against the system's CAs (or SPOTLIGHT_REDIS_CA_FILE)."""
    ca_file: str | None = None
    run_ca: str | None = field(default=None, repr=False)
    """The run's CA certificate (PEM text) from SPOTLIGHT_REDIS_RUN_CA; it takes precedence over ca_file."""
    client_cert: str | None = field(default=None, repr=False)
    """This client's certificate and key (PEM text) from SPOTLIGHT_REDIS_CLIENT_CERT/_KEY, with the run's CA only."""
    client_key: str | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"RedisAddress({self.url!r})"

    @property
    def url(self) -> str:
        user = f"{self.username}@" if self.username else ""
        return f"{'rediss' if self.tls else 'redis'}://{user}{self.host}:{self.port}/{self.db}"


def redis_address(url: str, env: Mapping[str, str] = os.environ) -> RedisAddress:
    """Check a redis:// or rediss:// URL without connecting. The password comes from the URL, else from
    SPOTLIGHT_REDIS_PASSWORD, else from the file SPOTLIGHT_REDIS_PASSWORD_FILE names. Prefer the variables:
    a URL with a password ends up on command lines (`ps` shows it to every user of the machine)."""
    parsed = urlparse(url)
    scheme = parsed.scheme.lower()
    # Never echo the URL in these errors: it may hold the password.
    safe = f"{scheme}://{parsed.hostname or ''}:{parsed.port if _port_ok(parsed) else '?'}{parsed.path}"
    if scheme not in REDIS_SCHEMES or not parsed.hostname or parsed.query or parsed.fragment:
        raise ValueError(
            f"queue URL {safe!r}: use redis://host:port/db (or rediss:// for TLS), the password "
            f"in {PASSWORD_ENV} or {PASSWORD_FILE_ENV}"
        )
    if not _port_ok(parsed):
        raise ValueError(f"queue URL {safe!r}: the port must be a number in 1-65535")
    db_text = parsed.path.strip("/") or "0"
    if not db_text.isdigit():
        raise ValueError(f"queue URL {safe!r}: the database must be a number, as in redis://host:6379/0")
    password = unquote(parsed.password) if parsed.password else redis_password(env)
    username = unquote(parsed.username) if parsed.username else None
    ca_file = (env.get(CA_FILE_ENV) or None) if scheme == "rediss" else None
    if ca_file is not None and not Path(ca_file).is_file():
        raise ValueError(
            f"{CA_FILE_ENV}={ca_file} is not a file: point it at the PEM bundle that signed the "
            "Redis server's certificate, or unset it to trust the system's CAs"
        )
    run_ca = _run_ca(env) if scheme == "rediss" else None
    cert, key = _client_cert(env) if run_ca is not None else (None, None)
    return RedisAddress(
        parsed.hostname,
        parsed.port or 6379,
        int(db_text),
        username,
        password,
        tls=scheme == "rediss",
        ca_file=ca_file,
        run_ca=run_ca,
        client_cert=cert,
        client_key=key,
    )


def _client_cert(env: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(certificate, key) PEM text from SPOTLIGHT_REDIS_CLIENT_CERT and _KEY (base64), or (None, None); ValueError
    when only one is set or either is not base64 PEM."""
    import base64
    import binascii

    cert, key = env.get(CLIENT_CERT_ENV), env.get(CLIENT_KEY_ENV)
    if not cert and not key:
        return None, None
    texts = []
    for name, raw, marker in ((CLIENT_CERT_ENV, cert, "CERTIFICATE-----"), (CLIENT_KEY_ENV, key, "PRIVATE KEY-----")):
        try:
            text = base64.b64decode(raw or "", validate=True).decode("ascii")
        except (binascii.Error, UnicodeDecodeError):
            text = ""
        if marker not in text:
            raise ValueError(
                f"{name} is {'not set' if not raw else 'not a base64 PEM'}: set both {CLIENT_CERT_ENV} and "
                f"{CLIENT_KEY_ENV} to the worker's client certificate and key as spotlight launch hands them out"
            )
        texts.append(text)
    return texts[0], texts[1]


def _run_ca(env: Mapping[str, str]) -> str | None:
    """The PEM text of SPOTLIGHT_REDIS_RUN_CA (base64); ValueError when it is not one."""
    import base64
    import binascii

    raw = env.get(RUN_CA_ENV)
    if not raw:
        return None
    try:
        pem = base64.b64decode(raw, validate=True).decode("ascii")
    except (binascii.Error, UnicodeDecodeError):
        pem = ""
    if "-----BEGIN CERTIFICATE-----" not in pem:
        raise ValueError(
            f"{RUN_CA_ENV} is not a base64 PEM certificate: set it to the run's CA as spotlight launch "
            "hands it to the workers (or unset it)"
        )
    return pem


def split_password(url: str) -> tuple[str, str | None]:
    """A URL without its `:password@` part, and that password (None when it has none).

    For handing a queue to a child process: the URL goes on its command line, the password
    into its environment as SPOTLIGHT_REDIS_PASSWORD, so `ps` never shows it.
    """
    parsed = urlsplit(url)
    if parsed.password is None:
        return url, None
    user = f"{parsed.username}@" if parsed.username else ""
    netloc = user + parsed.netloc.rsplit("@", 1)[1]
    return urlunsplit(parsed._replace(netloc=netloc)), unquote(parsed.password)


def redis_password(env: Mapping[str, str] = os.environ) -> str | None:
    """SPOTLIGHT_REDIS_PASSWORD, else the first line of the file SPOTLIGHT_REDIS_PASSWORD_FILE, else None."""
    if env.get(PASSWORD_ENV):
        return env[PASSWORD_ENV]
    path = env.get(PASSWORD_FILE_ENV)
    if not path:
        return None
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise ValueError(
            f"{PASSWORD_FILE_ENV}={path} cannot be read ({err.strerror}): point it at a file "
            "holding the Redis password, or set SPOTLIGHT_REDIS_PASSWORD instead"
        ) from None
    if not lines or not lines[0].strip():
        raise ValueError(f"{PASSWORD_FILE_ENV}={path} is empty: write the Redis password on its first line")
    return lines[0].strip()


def _port_ok(parsed: Any) -> bool:
    try:
        return parsed.port is None or 0 < parsed.port < 65536
    except ValueError:
        return False
