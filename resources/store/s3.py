"""S3TensorStore: the same store on AWS S3 or any S3-compatible endpoint (MinIO, R2, GCS interop).

Endpoint, region and credentials come only from boto3's standard configuration
(`AWS_ENDPOINT_URL`, `AWS_DEFAULT_REGION`, `AWS_PROFILE`, `AWS_ACCESS_KEY_ID`, ...) or the
explicit `endpoint_url` argument; nothing secret is ever logged or put in an error.

Transient faults are absorbed: botocore's retry mode ("standard" or "adaptive") re-sends a
call answered 5xx, throttled (SlowDown, 429), timed out or reset; a GET whose body breaks off,
stalls or fails its S3 checksum is sent again (`S3Config.read_attempts`), and so is one whose
bytes do not match the manifest (resources/store/base.py). A fault that persists ends in one
StoreError naming the operation, the s3:// key, the endpoint and what happened, after at
most max_attempts x (connect_timeout_s + read_timeout_s) plus backoff per call: never a hang.
"""

from __future__ import annotations

import contextlib
import io
import logging
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from resources.keys import check_key, check_prefix
from resources.store.base import ObjectNotFoundError, StoreError, TensorStore

_MIB = 1024 * 1024
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
_DENIED = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "403", "ExpiredToken"}
_THROTTLED = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests", "429"}
_RETRY_MODES = ("standard", "adaptive")
log = logging.getLogger("spotlight.store")


@dataclass(frozen=True)
class S3Config:
    """Transfer and retry settings of the S3 backend."""

    max_attempts: int = 8
    """Attempts per API call including the first. botocore retries throttling (SlowDown, 429),
    5xx, timeouts and connection errors with jittered exponential backoff (at most 20 s)."""
    retry_mode: str = "standard"
    """botocore's retry mode: "standard", or "adaptive" (also paces this client's request rate
    while the endpoint throttles; for many workers sharing one bucket)."""
    read_attempts: int = 3
    """GETs of one object whose answer broke off (short body), stalled past read_timeout_s, or
    failed its checksum (S3's or the manifest's) before the read fails; each GET has its own
    max_attempts."""
    multipart_threshold_bytes: int = 64 * _MIB
    """Objects at least this large are uploaded in parts and read with ranged parallel GETs."""
    multipart_chunksize_bytes: int = 16 * _MIB
    """Part size; S3 requires at least 5 MiB for every part but the last."""
    max_concurrency: int = 8
    """Parallel part transfers per large object."""
    connect_timeout_s: float = 10.0
    """Seconds to open a connection before that attempt fails (and is retried)."""
    read_timeout_s: float = 60.0
    """Seconds without data on an open connection before that attempt fails."""
    conflict_retries: int = 6
    """Own retries of a conditional create answered 409 ConditionalRequestConflict (a
    concurrent conditional write was in flight; S3 asks the client to retry)."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1 or self.read_attempts < 1:
            raise ValueError(
                f"S3Config.max_attempts and read_attempts must be >= 1, got {self.max_attempts}, {self.read_attempts}"
            )
        if self.retry_mode not in _RETRY_MODES:
            raise ValueError(f"S3Config.retry_mode must be one of {_RETRY_MODES}, got {self.retry_mode!r}")
        if self.multipart_chunksize_bytes < 5 * _MIB:
            raise ValueError(
                "S3Config.multipart_chunksize_bytes must be >= 5 MiB (S3's minimum part size), "
                f"got {self.multipart_chunksize_bytes}"
            )
        if self.multipart_threshold_bytes < self.multipart_chunksize_bytes:
            raise ValueError("S3Config.multipart_threshold_bytes must be >= multipart_chunksize_bytes")
        if self.max_concurrency < 1 or self.conflict_retries < 0:
            raise ValueError("S3Config.max_concurrency must be >= 1 and conflict_retries >= 0")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ValueError("S3Config timeouts must be > 0 seconds")


class S3TensorStore(TensorStore):
    """Objects are S3 objects `{prefix}/{key}` in `bucket`."""

    def __init__(
        self, bucket: str, prefix: str = "", endpoint_url: str | None = None, *, config: S3Config = S3Config()
    ) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config

        if not _BUCKET_RE.match(bucket or ""):
            raise ValueError(f"S3 bucket name {bucket!r} is invalid: 3-63 characters of a-z 0-9 . -")
        self.bucket = bucket
        self.prefix = check_prefix(prefix.strip("/"))
        self.config = config
        botocore_config = Config(
            retries={"mode": config.retry_mode, "total_max_attempts": config.max_attempts},
            connect_timeout=config.connect_timeout_s,
            read_timeout=config.read_timeout_s,
            max_pool_connections=max(10, 2 * config.max_concurrency),
        )
        # endpoint_url=None lets boto3 take AWS_ENDPOINT_URL / profile settings itself.
        self.client = boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=botocore_config)
        self.transfer = TransferConfig(
            multipart_threshold=config.multipart_threshold_bytes,
            multipart_chunksize=config.multipart_chunksize_bytes,
            max_concurrency=config.max_concurrency,
            num_download_attempts=config.read_attempts,
        )
        self.read_attempts = config.read_attempts

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def endpoint_url(self) -> str:
        """The endpoint boto3 resolved (explicit, AWS_ENDPOINT_URL, or AWS's default)."""
        return self.client.meta.endpoint_url

    def __repr__(self) -> str:
        return f"S3TensorStore({self.url!r}, endpoint={self.endpoint_url!r})"

    def _full(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def put_bytes(self, key: str, data: bytes) -> None:
        full = self._full(key)
        with self._errors("write", key):
            if len(data) >= self.config.multipart_threshold_bytes:
                self.client.upload_fileobj(io.BytesIO(data), self.bucket, full, Config=self.transfer)
            else:
                self.client.put_object(Bucket=self.bucket, Key=full, Body=data)

    def get_bytes(self, key: str) -> bytes:
        from botocore.exceptions import (
            FlexibleChecksumError,
            IncompleteReadError,
            ReadTimeoutError,
            ResponseStreamingError,
        )

        broken = (IncompleteReadError, ResponseStreamingError, ReadTimeoutError, FlexibleChecksumError)
        with self._errors("read", key):
            for attempt in range(1, self.config.read_attempts + 1):
                body = self.client.get_object(Bucket=self.bucket, Key=self._full(key))["Body"]
                try:
                    return body.read()  # botocore checks the length against Content-Length (and S3's checksum)
                except broken as err:
                    # The answer arrived but its body did not: botocore does not retry that itself.
                    body.close()
                    if attempt == self.config.read_attempts:
                        raise StoreError(self._failed("read", key, _what(err, self.config), attempt)) from err
                    log.warning("S3 read of %s broke off (%s); reading it again", self._where(key), type(err).__name__)
                    time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def read_to_file(self, key: str, path: Path) -> None:
        # s3transfer: ranged parallel GETs for big objects, written to a temp file then renamed, each
        # GET retried on a broken or stalled body (num_download_attempts).
        with self._errors("read", key):
            self.client.download_file(self.bucket, self._full(key), str(path), Config=self.transfer)

    def get_sized(self, key: str, size_bytes: int) -> bytes:
        if size_bytes < self.config.multipart_threshold_bytes:
            return self.get_bytes(key)
        buffer = io.BytesIO()
        with self._errors("read", key):
            self.client.download_fileobj(self.bucket, self._full(key), buffer, Config=self.transfer)
        return buffer.getvalue()

    def exists(self, key: str) -> bool:
        try:
            with self._errors("check", key):
                self.client.head_object(Bucket=self.bucket, Key=self._full(key))
        except ObjectNotFoundError:
            return False
        return True

    def check_reachable(self) -> None:
        """One listing of at most one key: StoreError (endpoint unreachable, no bucket, denied) before any real work."""
        with self._errors("reach", ""):
            self.client.list_objects_v2(Bucket=self.bucket, Prefix=f"{self.prefix}/" if self.prefix else "", MaxKeys=1)

    def list_keys(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        base = f"{self.prefix}/" if self.prefix else ""
        keys = []
        with self._errors("list", prefix or "(all)"):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=base + prefix)
            for page in pages:
                keys.extend(obj["Key"][len(base) :] for obj in page.get("Contents", []))
        return sorted(keys)

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self.client.delete_object(Bucket=self.bucket, Key=self._full(key))

    def delete_keys(self, keys: Iterable[str]) -> None:
        batch = [{"Key": self._full(k)} for k in keys]
        for start in range(0, len(batch), 1000):  # DeleteObjects takes at most 1000 keys
            with self._errors("delete", f"{len(batch)} keys"):
                answer = self.client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": batch[start : start + 1000], "Quiet": True}
                )
            if answer.get("Errors"):
                first = answer["Errors"][0]
                raise StoreError(
                    f"S3 delete failed for {len(answer['Errors'])} keys, e.g. {first.get('Key')}: {first.get('Code')}"
                )

    def create_exclusive(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        for attempt in range(self.config.conflict_retries + 1):
            try:
                with self._errors(
                    "create", key, passthrough={"PreconditionFailed", "412", "ConditionalRequestConflict", "409"}
                ):
                    self.client.put_object(Bucket=self.bucket, Key=self._full(key), Body=data, IfNoneMatch="*")
                return True
            except ClientError as err:
                code = _code(err)
                if code in ("PreconditionFailed", "412"):
                    return False
                if attempt == self.config.conflict_retries:
                    raise StoreError(
                        f"conditional create of {self._where(key)} kept conflicting ({code}) "
                        f"after {attempt + 1} attempts"
                    ) from err
                time.sleep(min(2.0, 0.05 * 2**attempt) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    @contextlib.contextmanager
    def _errors(self, op: str, key: str, passthrough: frozenset[str] | set[str] = frozenset()) -> Iterator[None]:
        """Turn botocore errors into store errors that say what to do (never credentials)."""
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError, NoCredentialsError

        where = self._where(key)
        try:
            yield
        except ClientError as err:
            code = _code(err)
            if code in passthrough:
                raise
            if code in _NOT_FOUND:
                raise ObjectNotFoundError(f"no object at {where}") from err
            if code == "NoSuchBucket":
                raise StoreError(
                    f"bucket {self.bucket!r} does not exist at {self.endpoint_url}; create it first"
                ) from err
            if code in _DENIED:
                raise StoreError(
                    f"S3 {op} of {where} was denied ({code}): "
                    "check the credentials boto3 finds (env, profile) and the bucket policy"
                ) from err
            attempts = (err.response.get("ResponseMetadata", {}).get("RetryAttempts") or 0) + 1
            raise StoreError(self._failed(op, key, _what(err, self.config), attempts)) from err
        except NoCredentialsError as err:
            raise StoreError(
                "no AWS credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE for boto3"
            ) from err
        except EndpointConnectionError as err:
            raise StoreError(f"cannot reach S3 endpoint {self.endpoint_url} for {op} of {where}: {err}") from err
        except (BotoCoreError, Boto3Error) as err:
            cause = getattr(err, "last_exception", None) or err  # s3transfer's RetriesExceededError wraps the last one
            raise StoreError(self._failed(op, key, _what(cause, self.config), None)) from err

    def _failed(self, op: str, key: str, what: str, attempts: int | None) -> str:
        tries = (
            f"after {attempts} attempts"
            if attempts
            else f"after retries (up to {self.config.max_attempts} attempts per call)"
        )
        return (
            f"S3 {op} of {self._where(key)} failed {tries} (endpoint {self.endpoint_url}): {what}. "
            "What was committed before stays readable; once the endpoint is healthy, retry "
            "(a run continues with --resume)."
        )


def _what(err: BaseException, config: S3Config) -> str:
    """What went wrong, in words, for one botocore/s3transfer error."""
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        ConnectTimeoutError,
        FlexibleChecksumError,
        IncompleteReadError,
        ReadTimeoutError,
        ResponseStreamingError,
    )

    if isinstance(err, ClientError):
        code, status = _code(err), err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
        message = err.response.get("Error", {}).get("Message", "")
        if code in _THROTTLED:
            return (
                f"the endpoint kept throttling ({code} {status}: {message}); use fewer workers, or "
                "S3Config(retry_mode='adaptive', max_attempts=...) to pace and retry longer"
            )
        if isinstance(status, int) and status >= 500:
            return f"the endpoint kept answering with a server error ({code} {status}: {message})"
        return f"{code} {status}: {message}"
    if isinstance(err, ConnectTimeoutError):
        return f"no connection within connect_timeout_s={config.connect_timeout_s:g} s"
    if isinstance(err, ReadTimeoutError):
        return f"no answer within read_timeout_s={config.read_timeout_s:g} s (the endpoint stalled)"
    if isinstance(err, ConnectionClosedError):
        return "the connection was closed or reset before an answer arrived"
    if isinstance(err, (IncompleteReadError, ResponseStreamingError)):
        return f"the answer broke off before its end (a short read: {err})"
    if isinstance(err, FlexibleChecksumError):
        return f"the answer's bytes did not match S3's checksum ({err})"
    return f"{type(err).__name__}: {err}"


def _code(err: Exception) -> str:
    return str(getattr(err, "response", {}).get("Error", {}).get("Code", ""))
