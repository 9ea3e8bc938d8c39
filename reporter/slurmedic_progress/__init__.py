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

Standard library only: training environments install this without slurmedic's service.
"""

from __future__ import annotations

import base64
import http.client
import math
import os
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

__all__ = ["GAUGES", "PUSH_JOB", "ProgressReporter"]

PUSH_JOB = "training"
# Every gauge a rank pushes (each with one label, `node`), and its help text.
GAUGES = {
    "training_step": "Last completed training step.",
    "training_step_seconds": "This rank's compute time of the last step.",
    "training_last_step_timestamp_seconds": "When the last step completed.",
    "training_last_checkpoint_step": "Step of the last complete checkpoint.",
    "training_last_checkpoint_timestamp_seconds": "When the last checkpoint was written.",
    "training_attempt": "Slurm restart count of this job attempt.",
    "training_attempt_start_timestamp_seconds": "When this attempt started.",
}
# The Prometheus text format, version 0.0.4: what the Pushgateway accepts from every client.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class ProgressReporter:
    gateway: str | None
    job_id: str
    rank: int
    node: str
    attempt: int = 0
    timeout: float = 1.0
    failed_pushes: int = 0
    # The gauges set so far; a push sends only these, and replaces the rank's whole group.
    values: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.values["training_attempt"] = self.attempt

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
        self.values["training_attempt_start_timestamp_seconds"] = time.time()
        self._push()

    def step(self, step: int, seconds: float) -> None:
        self.values["training_step"] = step
        self.values["training_step_seconds"] = seconds
        self.values["training_last_step_timestamp_seconds"] = time.time()
        self._push()

    def checkpoint(self, step: int, written_at: float | None = None) -> None:
        """A complete checkpoint at `step`. After a restart, report the one the attempt resumed
        from with `written_at` (when it was written): a checkpoint written before this attempt
        started is not one of its own."""
        self.values["training_last_checkpoint_step"] = step
        self.values["training_last_checkpoint_timestamp_seconds"] = (
            time.time() if written_at is None else written_at
        )
        self._push()

    def exposition(self) -> str:
        """The gauges set so far in the Prometheus text format: the body of a push."""
        node = _label_value(self.node)
        lines = []
        for name, help_text in GAUGES.items():
            if name in self.values:
                lines += [
                    f"# HELP {name} {help_text}",
                    f"# TYPE {name} gauge",
                    f'{name}{{node="{node}"}} {_number(self.values[name])}',
                ]
        return "\n".join(lines) + "\n"

    def url(self) -> str:
        """Where this rank's group lives on the Pushgateway."""
        gateway = str(self.gateway)
        if urllib.parse.urlsplit(gateway).scheme not in ("http", "https"):
            gateway = f"http://{gateway}"
        key = [("job", PUSH_JOB), ("slurm_job_id", self.job_id), ("rank", str(self.rank))]
        return gateway.rstrip("/") + "/metrics" + "".join(_path_part(k, v) for k, v in key)

    def _push(self) -> None:
        if not self.gateway:
            return
        request = urllib.request.Request(  # noqa: S310 - the operator's Pushgateway URL
            self.url(),
            data=self.exposition().encode(),
            method="PUT",  # PUT replaces the group: nothing of a previous attempt stays
            headers={"Content-Type": CONTENT_TYPE},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout):  # noqa: S310
                pass
        except (OSError, http.client.HTTPException):
            self.failed_pushes += 1


def _path_part(name: str, value: str) -> str:
    # The Pushgateway's grouping-key syntax: base64 for values a URL path cannot carry.
    if value == "" or "/" in value:
        return f"/{name}@base64/{base64.urlsafe_b64encode(value.encode()).decode() or '='}"
    return f"/{name}/{urllib.parse.quote(value, safe='')}"


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))
