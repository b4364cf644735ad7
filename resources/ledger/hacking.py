"""The reward-hacking guard's ledger writes (tables `hacking_signals`, `hacking_rollbacks`), mixed into `Ledger`."""

from __future__ import annotations

from resources.ledger.records import HackingRollbackRecord, HackingSignalsRecord


class HackingRecords:
    """`Ledger` methods for the reward-hacking guard (workers/coordinator/hacking_guard.py); `_upsert` is Ledger's."""

    def record_hacking_signals(self, record: HackingSignalsRecord) -> None:
        """A validation's reward-hacking signals and verdict (view `reward_hacking`); re-recording replaces it."""
        self._upsert("hacking_signals", [record])  # type: ignore[attr-defined]

    def record_hacking_rollback(self, record: HackingRollbackRecord) -> None:
        """A rollback to the best-gold weights after a flagged validation."""
        self._upsert("hacking_rollbacks", [record])  # type: ignore[attr-defined]
