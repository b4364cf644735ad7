"""Writes what `spotlight train` does into the run ledger (runs, iterations, phases, worker, steps, validation).

The synchronous loop is its own coordinator: one process, recorded as one reserved
"trainer" worker whose $/hour the user states (there is no GPU to price).

Example:
    recorder = TrainLedgerRecorder(Path("runs/demo/ledger.duckdb"), "demo", "cpu_tiny", config, 0.10)
    recorder.start()
    recorder.record(record, started_at, ended_at)     # once per yielded iteration record
    recorder.finish("succeeded")
"""

from __future__ import annotations

import dataclasses
import platform
from pathlib import Path

from resources.ledger import Ledger
from resources.ledger_records import TrainStepRecord

WORKER_ID = "trainer-0"


class TrainLedgerRecorder:
    def __init__(self, path: Path, run_id: str, preset: str, config, usd_per_hour: float):
        self.ledger = Ledger(path)
        self.run_id = run_id
        self.preset = preset
        self.config = config
        self.usd_per_hour = usd_per_hour

    def start(self) -> None:
        self.ledger.start_run(self.run_id, preset=self.preset, config=dataclasses.asdict(self.config))
        self.ledger.start_worker(WORKER_ID, role="trainer", instance_type=f"local-{platform.machine()}-cpu",
                                 spot=False, num_gpus=0, usd_per_hour=self.usd_per_hour)

    def record(self, record: dict, started_at: float, ended_at: float) -> None:
        """One iteration record of run_training, timed by the caller (POSIX seconds)."""
        it = record["iteration"]
        version_before = max(0, it - 1)  # iteration k trains weights version k-1 into k
        ledger = self.ledger
        ledger.start_iteration(it, weights_version=version_before, at=started_at)
        t = started_at
        if it > 0:
            ledger.record_phase(it, "rollout", t, t + record["rollout_s"])
            t += record["rollout_s"]
            ledger.record_phase(it, "train", t, t + record["train_s"])
            t += record["train_s"]
            ledger.record_train_step(TrainStepRecord(
                iteration=it, step=it, loss=record["loss"], kl=record["kl"], reward_mean=record["reward_mean"],
                reward_std=record["reward_std"], zero_std_ratio=record["zero_std_ratio"],
                clip_fraction=record.get("clip_frac"), grad_norm=record["grad_norm"],
                learning_rate=record.get("learning_rate", self.config.grpo.lr), duration_s=record["train_s"],
            ))
        if record["validation_score"] is not None:
            ledger.record_phase(it, "validate", t, ended_at)
            criteria = dict(record["validation_per_criterion"])
            criteria.update({f"category.{k}": v for k, v in record["validation_per_category"].items()})
            ledger.record_validation(it, weights_version=it, score=record["validation_score"],
                                     num_prompts=record["validation_num_prompts"], criteria=criteria, at=ended_at)
        ledger.end_iteration(it, at=ended_at)

    def finish(self, status: str) -> None:
        self.ledger.end_worker(WORKER_ID, reason="finished" if status == "succeeded" else "interrupted")
        self.ledger.end_run(self.run_id, status=status)
        self.ledger.close()
