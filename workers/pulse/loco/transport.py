"""How PULSELoCo replicas swap their per-round payloads: the tensor store, or torch.distributed (gloo).

Both answer `exchange(round_index, payload)` with the payloads the round counts, keyed
by replica, and every member of the round gets the same set.

Tensor store (works across clouds): each replica publishes its payload under
`{prefix}/round-R/replica-I` (publish, then commit), then polls for the others. When
all members have published, or when `timeout_s` has passed and the missing policy is
`survivors`, some replica commits `{prefix}/round-R/close` with conditional create,
naming the members counted; exactly one such commit wins and every replica uses it.
A payload that lands after the close is ignored, and its sender is out of the group
(ReplicaExcludedError), so nothing is counted twice or in a later round. Policy `wait`
raises RoundTimeoutError instead.

torch.distributed (one cluster): all_gather of sizes, then of the padded payloads. A
gloo group cannot shrink in place, so a dead peer makes the round fail with
RoundTimeoutError after at most `timeout_s`.

Example:
    exchange = StoreExchange(store, "loco/run1/pulseloco", replica=0, num_replicas=2, config=ExchangeConfig())
    result = exchange.exchange(3, payload)      # result.payloads: {0: b"...", 1: b"..."}
"""

from __future__ import annotations

import datetime
import json
import time
from dataclasses import dataclass

import torch

from resources.keys import check_key
from resources.store.base import TensorStore

MISSING_POLICIES = ("survivors", "wait")
TRANSPORTS = ("store", "gloo")
PAYLOAD_NAME = "payload.bin"


class RoundTimeoutError(Exception):
    """A round could not complete: replicas missing after the timeout (or a peer died under gloo)."""


class ReplicaExcludedError(Exception):
    """This replica's payload arrived after the round closed without it; it has left the group."""


@dataclass(frozen=True)
class ExchangeConfig:
    """How long a round waits for replicas, and what it does when some never arrive."""

    timeout_s: float = 120.0
    """Seconds a round waits for every member's payload."""
    join_timeout_s: float = 600.0
    """Seconds the first exchange waits instead (replicas start at different times, e.g. spot nodes)."""
    missing_policy: str = "survivors"
    """survivors: close the round with those present after timeout_s; wait: raise RoundTimeoutError."""
    poll_s: float = 0.05
    """Store transport: seconds between polls of the round's commits."""

    def __post_init__(self) -> None:
        if not 0 < self.timeout_s <= 86_400:
            raise ValueError(f"ExchangeConfig.timeout_s must be in (0, 86400], got {self.timeout_s}")
        if not 0 < self.join_timeout_s <= 86_400:
            raise ValueError(f"ExchangeConfig.join_timeout_s must be in (0, 86400], got {self.join_timeout_s}")
        if self.missing_policy not in MISSING_POLICIES:
            raise ValueError(
                f"ExchangeConfig.missing_policy must be one of {MISSING_POLICIES}, got {self.missing_policy!r}"
            )
        if not 0 < self.poll_s <= self.timeout_s:
            raise ValueError(f"ExchangeConfig.poll_s must be in (0, timeout_s], got {self.poll_s}")


@dataclass(frozen=True)
class RoundResult:
    """The payloads one round counts, the same on every member."""

    payloads: dict[int, bytes]
    """Payload of each counted replica, in replica order."""

    @property
    def members(self) -> tuple[int, ...]:
        return tuple(self.payloads)


class StoreExchange:
    """Round exchange through a TensorStore (local folder or S3)."""

    def __init__(
        self, store: TensorStore, prefix: str, *, replica: int, num_replicas: int, config: ExchangeConfig
    ) -> None:
        _check_replica(replica, num_replicas)
        self.store, self.prefix, self.replica, self.config = store, check_key(prefix), replica, config
        self.members = tuple(range(num_replicas))
        """Replicas expected next round: shrinks when a round closes without some."""
        self.joined = False
        """True after the first round closed (later rounds wait timeout_s, the first join_timeout_s)."""

    def exchange(self, round_index: int, payload: bytes) -> RoundResult:
        if self.replica not in self.members:
            raise ReplicaExcludedError(f"replica {self.replica} left the group before round {round_index}")
        self.store.publish(self._payload_key(round_index, self.replica), {PAYLOAD_NAME: payload}, exclusive=True)
        members = self._await_close(round_index)
        self.members, self.joined = members, True
        if self.replica not in members:
            raise ReplicaExcludedError(
                f"round {round_index} closed with replicas {list(members)} before replica {self.replica}'s payload; "
                "its pseudo-gradient was not counted and it has left the group"
            )
        return RoundResult({r: self.store.load_bytes(self._payload_key(round_index, r), PAYLOAD_NAME) for r in members})

    def _await_close(self, round_index: int) -> tuple[int, ...]:
        """Members of the committed close record, committing it ourselves when it is due."""
        timeout_s = self.config.timeout_s if self.joined else self.config.join_timeout_s
        deadline = time.monotonic() + timeout_s
        close_key = f"{self._round_key(round_index)}/close"
        while True:
            manifest = self.store.read_manifest(close_key)
            if manifest is not None:
                return tuple(manifest.metadata["members"])
            present = [
                r for r in self.members if self.store.read_manifest(self._payload_key(round_index, r)) is not None
            ]
            timed_out = time.monotonic() >= deadline
            if len(present) == len(self.members) or (timed_out and self.config.missing_policy == "survivors"):
                members = json.dumps(present).encode()
                self.store.publish(close_key, {"members.json": members}, {"members": present}, exclusive=True)
                continue  # read back whichever close record won
            if timed_out:
                missing = sorted(set(self.members) - set(present))
                raise RoundTimeoutError(
                    f"round {round_index}: replicas {missing} did not publish within {timeout_s} s "
                    "(missing_policy='wait'; use 'survivors' to continue without them)"
                )
            time.sleep(self.config.poll_s)

    def _round_key(self, round_index: int) -> str:
        return f"{self.prefix}/round-{round_index:08d}"

    def _payload_key(self, round_index: int, replica: int) -> str:
        return f"{self._round_key(round_index)}/replica-{replica:04d}"

    def close(self) -> None:
        """Nothing to release (the store outlives the exchange)."""


class GlooExchange:
    """Round exchange by torch.distributed collectives (gloo on CPU)."""

    def __init__(self, init_method: str, *, replica: int, num_replicas: int, config: ExchangeConfig) -> None:
        _check_replica(replica, num_replicas)
        if config.missing_policy != "wait":
            raise ValueError(
                "ExchangeConfig.missing_policy must be 'wait' with the gloo transport (a gloo group cannot "
                "continue without a dead member); use transport='store' for 'survivors'"
            )
        import torch.distributed as dist

        self.dist, self.replica, self.num_replicas = dist, replica, num_replicas
        self.round_timeout = datetime.timedelta(seconds=config.timeout_s)
        # Joining waits join_timeout_s; each collective then waits timeout_s (Work.wait below).
        dist.init_process_group(
            "gloo",
            init_method=init_method,
            rank=replica,
            world_size=num_replicas,
            timeout=datetime.timedelta(seconds=max(config.join_timeout_s, config.timeout_s)),
        )

    def exchange(self, round_index: int, payload: bytes) -> RoundResult:
        try:
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.num_replicas)]
            self.dist.all_gather(sizes, torch.tensor([len(payload)], dtype=torch.int64), async_op=True).wait(
                self.round_timeout
            )
            longest = int(max(size.item() for size in sizes))
            mine = torch.zeros(longest, dtype=torch.uint8)
            if payload:
                mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            gathered = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.num_replicas)]
            self.dist.all_gather(gathered, mine, async_op=True).wait(self.round_timeout)
        except RuntimeError as err:  # gloo: peer closed the connection, or the collective timed out
            raise RoundTimeoutError(f"round {round_index}: a replica did not take part ({err})") from err
        return RoundResult({r: gathered[r][: int(sizes[r].item())].numpy().tobytes() for r in range(self.num_replicas)})

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


def _check_replica(replica: int, num_replicas: int) -> None:
    if num_replicas < 1 or not 0 <= replica < num_replicas:
        raise ValueError(f"replica must be in [0, num_replicas), got replica={replica}, num_replicas={num_replicas}")
