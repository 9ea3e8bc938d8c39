"""The console's request for a recovery drill, checked at the boundary: what the form says
becomes the same `ledger.drills.ask(...)` as `slurmedic drill JOB`, or a status with a one-line
reason naming the field. Nothing of the form reaches the ledger unchecked: the job id and the
node name end up on a playbook's command line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from webhook.adapters.prometheus import Prometheus, PrometheusError
from webhook.cli.drill import CHECKPOINTS_WINDOW
from webhook.core import drills
from webhook.core.patterns import JOB_ID, NODE_NAME

# The ledger's job columns are 32-bit integers (PostgreSQL): a larger id could not be kept.
LARGEST_JOB = 2**31 - 1
NOW, BEFORE_CHECKPOINT = "now", "before_checkpoint"
WHEN = (NOW, BEFORE_CHECKPOINT)
# How long before the checkpoint is due, as `slurmedic drill --before-checkpoint` by default.
MARGIN = timedelta(seconds=30)
PROMETHEUS_TIMEOUT = 5.0  # seconds: a web worker waits for it


class FormError(ValueError):
    """A request the console refuses: the HTTP status and the reason."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class Asked:
    job: int
    exclude: str | None
    not_before: datetime


def job_of(text: str) -> int:
    job = text.strip()
    if not JOB_ID.match(job) or not 1 <= int(job) <= LARGEST_JOB:
        raise FormError(400, f"job: {job[:80]!r} is not a job id (a whole number from 1)")
    return int(job)


def exclude_of(text: str) -> str | None:
    node = text.strip()
    if not node:
        return None
    if not NODE_NAME.match(node):
        raise FormError(400, f"exclude: {node[:80]!r} is not a node name")
    return node


def parse(form: Mapping[str, str], prometheus_url: str | None, now: datetime) -> Asked:
    """The drill the form asks for, timed: now, or right before the job's next checkpoint is
    due (read from Prometheus, as the CLI does; without a Prometheus, only now)."""
    job = job_of(form.get("job", ""))
    exclude = exclude_of(form.get("exclude", ""))
    when = form.get("when", NOW) or NOW
    if when not in WHEN:
        raise FormError(400, f"when: {when[:40]!r} is not one of {', '.join(WHEN)}")
    if when == NOW:
        return Asked(job, exclude, now)
    if not prometheus_url:
        raise FormError(
            400,
            "when: before the next checkpoint needs verification.prometheus_url (the job's "
            "checkpoints are read from Prometheus); only now is offered",
        )
    try:
        times = Prometheus(prometheus_url, timeout=PROMETHEUS_TIMEOUT).checkpoint_times(
            job, CHECKPOINTS_WINDOW
        )
    except PrometheusError as e:
        raise FormError(503, f"when: the job's checkpoints could not be read: {e}") from e
    try:
        return Asked(job, exclude, drills.before_checkpoint(times, MARGIN, now))
    except drills.Refused as e:
        raise FormError(409, f"when: job {job}: {e}") from e
