"""Job-side training progress, pushed to a Prometheus Pushgateway.

Two lines in a training script::

    progress = ProgressReporter.from_env()     # at start: announces this attempt
    progress.step(step, step_seconds)          # after every optimizer step
    progress.checkpoint(step)                  # after a checkpoint is safely written
    progress.checkpoint(step, written_at=t)    # after a restart: the one it resumed from

`step_seconds` is this rank's own compute time for the step (forward, backward, optimizer),
without the time spent waiting in collectives for other ranks: in synchronous training every
rank's wall-clock step time is the same, and only the compute time shows which one is slow.

Environment: `SLURMEDIC_PUSHGATEWAY` (URL; unset disables reporting), and Slurm's own
`SLURM_JOB_ID`, `SLURM_PROCID` (the rank), `SLURMD_NODENAME`, `SLURM_RESTART_COUNT`. The grouping
key is the Slurm job id and the rank, so every rank owns one group and a requeued attempt
overwrites its predecessor's. A failed push never disturbs training: it is counted and retried
on the next call.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

PUSH_JOB = "training"


@dataclass
class ProgressReporter:
    gateway: str | None
    job_id: str
    rank: int
    node: str
    attempt: int = 0
    timeout: float = 1.0
    failed_pushes: int = 0
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        labels = ["node"]
        r = self.registry
        self._step = Gauge("training_step", "Last completed training step.", labels, registry=r)
        self._step_s = Gauge(
            "training_step_seconds",
            "This rank's compute time of the last step.",
            labels,
            registry=r,
        )
        self._step_ts = Gauge(
            "training_last_step_timestamp_seconds",
            "When the last step completed.",
            labels,
            registry=r,
        )
        self._ckpt = Gauge(
            "training_last_checkpoint_step",
            "Step of the last complete checkpoint.",
            labels,
            registry=r,
        )
        self._ckpt_ts = Gauge(
            "training_last_checkpoint_timestamp_seconds",
            "When the last checkpoint was written.",
            labels,
            registry=r,
        )
        self._attempt = Gauge(
            "training_attempt", "Slurm restart count of this job attempt.", labels, registry=r
        )
        self._attempt.labels(self.node).set(self.attempt)
        self._started = Gauge(
            "training_attempt_start_timestamp_seconds",
            "When this attempt started.",
            labels,
            registry=r,
        )

    @classmethod
    def from_env(cls) -> ProgressReporter:
        """A reporter for this rank, from Slurm's environment; pushes the attempt's start.

        The start replaces what the previous attempt pushed last, so a hang is measured from
        this attempt's start until its first step (while it loads its checkpoint).
        """
        env = os.environ
        reporter = cls(
            gateway=env.get("SLURMEDIC_PUSHGATEWAY") or None,
            job_id=env.get("SLURM_JOB_ID", "0"),
            rank=int(env.get("SLURM_PROCID", "0")),
            node=env.get("SLURMD_NODENAME", os.uname().nodename),
            attempt=int(env.get("SLURM_RESTART_COUNT", "0")),
        )
        reporter.start()
        return reporter

    def start(self) -> None:
        self._started.labels(self.node).set(time.time())
        self._push()

    def step(self, step: int, seconds: float) -> None:
        self._step.labels(self.node).set(step)
        self._step_s.labels(self.node).set(seconds)
        self._step_ts.labels(self.node).set(time.time())
        self._push()

    def checkpoint(self, step: int, written_at: float | None = None) -> None:
        """A complete checkpoint at `step`. After a restart, report the one the attempt resumed
        from with `written_at` (when it was written): a checkpoint written before this attempt
        started is not one of its own."""
        self._ckpt.labels(self.node).set(step)
        self._ckpt_ts.labels(self.node).set(time.time() if written_at is None else written_at)
        self._push()

    def _push(self) -> None:
        if not self.gateway:
            return
        try:
            push_to_gateway(
                self.gateway,
                job=PUSH_JOB,
                registry=self.registry,
                grouping_key={"slurm_job_id": self.job_id, "rank": str(self.rank)},
                timeout=self.timeout,
            )
        except OSError:
            self.failed_pushes += 1
