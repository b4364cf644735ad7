"""One replica of a multi-trainer run: local steps, then a DDP / DiLoCo / PULSELoCo sync per round.

The replica holds the FP32 global weights, the outer momentum and (PULSELoCo) the FP32
error-feedback buffer; after every round its model holds the new global weights,
bit-identical on every replica (`round_record["weights_hash"]` says so).

Example:
    replica = Replica(task, exchange, mode="pulseloco", replica=0, inner_steps=8)
    for round_index in range(rounds):
        record = replica.run_round(round_index)     # JSON-ready figures of the round
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from workers.pulse.loco.codec import decode_dense, decode_sparse, encode_dense, encode_sparse, layout_hash
from workers.pulse.loco.maths import (
    LOCO_MODES,
    OuterConfig,
    average_dense,
    average_sparse,
    dense_pseudo_gradient,
    flatten,
    gate_pseudo_gradient,
    names_and_shapes,
    outer_step,
    unflatten_into,
)
from workers.pulse.loco.tasks import LocalTask
from workers.pulse.loco.transport import RoundResult
from workers.pulse.weights_hash import weights_hash

Exchange = Callable[[int, bytes], RoundResult]


@dataclass
class _RoundTally:
    """What one replica sent in a round (DDP sends once per local step), and what the round counted."""

    bytes_sent: int = 0
    values_sent: int = 0
    encode_s: float = 0.0
    sync_s: float = 0.0
    counted: dict[int, dict[str, int]] = field(default_factory=dict)
    """Per sender whose payloads the round counted: bytes, values and exchanges (DDP: one per step)."""


class Replica:
    """A task plus the sync state of one replica."""

    def __init__(
        self,
        task: LocalTask,
        exchange: Exchange,
        *,
        mode: str,
        replica: int,
        inner_steps: int,
        outer: OuterConfig = OuterConfig(),
        zstd_level: int = 1,
    ) -> None:
        if mode not in LOCO_MODES:
            raise ValueError(f"mode must be one of {LOCO_MODES}, got {mode!r}")
        self.task, self.exchange, self.mode, self.replica = task, exchange, mode, replica
        self.inner_steps, self.outer, self.zstd_level = inner_steps, outer, zstd_level
        self.params = task.parameters_by_name()
        self.layout = layout_hash(names_and_shapes(self.params))
        self.global_N = flatten(self.params)
        self.numel = self.global_N.numel()
        self.momentum_N = torch.zeros_like(self.global_N)
        self.error_N = torch.zeros_like(self.global_N)
        self.tally = _RoundTally()
        self.step = 0
        if mode == "ddp":
            task.optimizer.register_step_pre_hook(self._average_gradients)

    def run_round(self, round_index: int) -> dict:
        """H local steps and the round's sync; returns the round's figures."""
        self.tally = _RoundTally()
        started = time.perf_counter()
        metrics = []
        for _ in range(self.inner_steps):
            metrics.append(self.task.local_step(self.step))
            self.step += 1
        if self.mode == "ddp":
            self.global_N = flatten(self.params)  # every step already synced
        else:
            self._outer_sync(round_index)
        record = {
            "round": round_index,
            "mode": self.mode,
            "replica": self.replica,
            "train_metric": sum(metrics) / len(metrics),
            "numel": self.numel,
            "bytes_sent": self.tally.bytes_sent,
            "values_sent": self.tally.values_sent,
            "density": self.tally.values_sent / (self.numel * (self.inner_steps if self.mode == "ddp" else 1)),
            "encode_s": self.tally.encode_s,
            "sync_s": self.tally.sync_s,
            "round_s": time.perf_counter() - started,
            "weights_hash": weights_hash({"global": self.global_N}),
            "error_norm": float(self.error_N.norm()),
            # What every member of the round received: the ledger counts a sender that died after
            # its payload was counted (and before it could report) from its peers' records.
            "counted": {str(sender): tally for sender, tally in sorted(self.tally.counted.items())},
        }
        return record

    def _outer_sync(self, round_index: int) -> None:
        local_N = flatten(self.params)
        t0 = time.perf_counter()
        if self.mode == "pulseloco":
            update, self.error_N = gate_pseudo_gradient(self.global_N, local_N, self.error_N)
            payload = encode_sparse(
                update, self.layout, round_index=round_index, replica=self.replica, level=self.zstd_level
            )
            sent = update.indices.numel()
        else:
            payload = encode_dense(
                dense_pseudo_gradient(self.global_N, local_N),
                self.layout,
                round_index=round_index,
                replica=self.replica,
            )
            sent = self.numel
        t1 = time.perf_counter()
        result = self.exchange(round_index, payload)
        avg_N = self._average(result, round_index)
        outer_step(self.global_N, self.momentum_N, avg_N, self.outer)
        unflatten_into(self.global_N, self.params)
        self._count(len(payload), sent, t1 - t0, time.perf_counter() - t1)

    def _average(self, result: RoundResult, round_index: int) -> torch.Tensor:
        """Mean pseudo-gradient of the counted payloads, decoded and summed in replica order."""
        decode = decode_sparse if self.mode == "pulseloco" else decode_dense
        decoded = []
        for sender, payload in result.payloads.items():
            header, update = decode(payload, self.layout, self.numel)
            _check_origin(header.round_index, header.replica, round_index, sender)
            decoded.append(update)
            tally = self.tally.counted.setdefault(sender, {"bytes": 0, "values": 0, "exchanges": 0})
            tally["bytes"] += len(payload)
            tally["values"] += header.count
            tally["exchanges"] += 1
        if self.mode == "pulseloco":
            return average_sparse(decoded, self.numel)
        return average_dense(decoded)

    def _average_gradients(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        """DDP: before every inner optimizer step, replace local gradients by the replicas' mean."""
        grads = {name: p.grad if p.grad is not None else torch.zeros_like(p) for name, p in self.params.items()}
        t0 = time.perf_counter()
        payload = encode_dense(flatten(grads), self.layout, round_index=self.step, replica=self.replica)
        t1 = time.perf_counter()
        result = self.exchange(self.step, payload)
        avg_N = self._average(result, self.step)
        for p in self.params.values():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        unflatten_into(avg_N, {name: p.grad for name, p in self.params.items()})
        self._count(len(payload), self.numel, t1 - t0, time.perf_counter() - t1)

    def _count(self, size: int, values: int, encode_s: float, sync_s: float) -> None:
        self.tally.bytes_sent += size
        self.tally.values_sent += values
        self.tally.encode_s += encode_s
        self.tally.sync_s += sync_s


def _check_origin(round_got: int, sender_got: int, round_want: int, sender_want: int) -> None:
    """A payload counts only in its own round and for its own sender (no replay, no double count)."""
    if (round_got, sender_got) != (round_want, sender_want):
        raise ValueError(
            f"payload of replica {sender_got}, round {round_got} arrived as replica {sender_want}, round {round_want}"
        )
