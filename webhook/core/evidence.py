"""Evidence: what one firing alert says, about which node and which job, checked against the
cluster view. An alert that names no valid node of the cluster is recorded, never acted on."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from webhook.core.alerts import Alert
from webhook.core.cluster import JOB_ID, ClusterView
from webhook.core.failures import gpu_of
from webhook.core.node_names import NodeNames
from webhook.core.signals import SIGNALS
from webhook.core.validation import is_number


def node_label(labels: dict[str, str]) -> str | None:
    """A node's identity (docs/operations.md): `node`, else `hostname`, else `Hostname`, else
    `instance` - port."""
    for key in ("node", "hostname", "Hostname"):
        if labels.get(key):
            return labels[key]
    instance = labels.get("instance", "")
    return instance.rsplit(":", 1)[0] if instance else None


def job_label(labels: dict[str, str]) -> str | None:
    for key in ("slurm_job_id", "hpc_job"):
        if labels.get(key):
            return labels[key]
    return None


@dataclass(frozen=True)
class Evidence:
    alertname: str
    signal: str
    node: str | None  # a valid node of the cluster, or None
    job: int | None
    fingerprint: str
    starts_at: datetime
    received_at: datetime
    summary: str = ""
    problems: tuple[str, ...] = field(default=())
    # When the condition the alert reports began, when it says (a hang's last progress);
    # startsAt is when the rule noticed.
    since: datetime | None = None
    # A task failure's line, as the node read it: which attempt failed (line_time).
    failed_at: datetime | None = None
    # The GPU it names (webhook.core.failures.gpu_of) and its XID, when it names them.
    gpu: str | None = None
    xid: int | None = None
    # A slow job's progress, as its slowdown alert reports it (webhook.core.slowdown): when its
    # last complete checkpoint was written, how far apart its checkpoints come, and how much
    # slower than usual it steps.
    checkpoint_at: datetime | None = None
    checkpoint_every: timedelta | None = None
    slowdown: float | None = None
    # How long the slowdown had lasted when the alert fired (its rule's `for:`).
    slow_for: timedelta | None = None
    # The host it names, when that is no node of the cluster (webhook.core.node_names).
    unmatched: str | None = None

    @property
    def actionable(self) -> bool:
        return not self.problems

    def record(self) -> dict[str, str | None]:
        return {
            "alertname": self.alertname,
            "node": self.node,
            "fingerprint": self.fingerprint,
            "startsAt": self.starts_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


VERBATIM = NodeNames()  # host names as Slurm spells them
MAX_EPOCH = 253402300799  # 9999-12-31T23:59:59Z
LINE_SKEW = timedelta(minutes=15)


def _number(text: str) -> float | None:
    """A finite number (a label's or an annotation's value), else None. Most alerts carry none
    of the annotations read here: an empty one is no number, without an exception."""
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def epoch(text: str) -> datetime | None:
    """Seconds since the epoch, when `text` is a sane such time (a label's or an annotation's
    value: anything else is no time)."""
    value = _number(text)
    if value is None or not 0 < value <= MAX_EPOCH:
        return None
    return datetime.fromtimestamp(value, UTC)


def stalled_since(alert: Alert) -> datetime | None:
    """When a hang began: its last progress (the annotation `stalled_since`)."""
    return epoch(alert.annotations.get("stalled_since", ""))


MAX_SECONDS = timedelta(days=7)
MAX_SLOWDOWN = 1000.0


def seconds(alert: Alert, key: str) -> timedelta | None:
    """An annotation's seconds (`checkpoint_every`, `slow_for`): positive, at most a week."""
    value = _number(alert.annotations.get(key, ""))
    if value is None or not 0 < value <= MAX_SECONDS.total_seconds():
        return None
    return timedelta(seconds=value)


def slowdown(alert: Alert) -> float | None:
    """How much slower than usual the job steps (the annotation `slowdown`): 1 or more."""
    value = _number(alert.annotations.get("slowdown", ""))
    return value if value is not None and 1.0 <= value <= MAX_SLOWDOWN else None


def line_time(alert: Alert) -> datetime | None:
    """When the node's mtail read a task failure's log line (`TrainingTaskFailed`'s label
    `failed_at`, on the node's clock, not Prometheus'). Believed only within LINE_SKEW of the
    alert's start, which comes a scrape and an evaluation after the line: a clock that far off,
    or another rule's label, says nothing."""
    at = epoch(alert.labels.get("failed_at", ""))
    if at is None or abs(alert.startsAt - at) > LINE_SKEW:
        return None
    return at


def from_alert(
    alert: Alert, received_at: datetime, view: ClusterView, names: NodeNames = VERBATIM
) -> Evidence:
    """What `alert` says, its host read as a node of `view` through the policy's `names`."""
    labels = alert.labels
    problems = []
    signal = labels.get("signal", "")
    if signal not in SIGNALS:
        problems.append(f"signal {signal!r} is not in the vocabulary" if signal else "no signal")
    raw_node = node_label(labels)
    found = names.resolve(raw_node, view.nodes, view.hosts) if raw_node is not None else None
    node = found if found is not None and view.valid_node(found) else None
    unmatched = raw_node[:80] if raw_node is not None and node is None else None
    if unmatched is not None:
        hint = names.hint(unmatched, view.nodes)
        problems.append(
            f"node {unmatched!r} is not a node of the cluster" + (f" ({hint})" if hint else "")
        )
    raw_job = job_label(labels)
    job = int(raw_job) if raw_job is not None and JOB_ID.match(raw_job) else None
    if raw_job is not None and job is None:
        problems.append(f"job {raw_job[:40]!r} is not a Slurm job id")
    if node is None and job is None and not problems:
        problems.append("names neither a node nor a job")
    return Evidence(
        alertname=labels.get("alertname", ""),
        signal=signal,
        node=node,
        job=job,
        fingerprint=alert.fingerprint,
        starts_at=alert.startsAt,
        received_at=received_at,
        summary=alert.annotations.get("summary", ""),
        problems=tuple(problems),
        since=stalled_since(alert),
        failed_at=line_time(alert),
        gpu=gpu_of(labels, node),
        xid=int(raw_xid)
        if is_number(raw_xid := labels.get("xid", "")) and len(raw_xid) < 5
        else None,
        checkpoint_at=epoch(alert.annotations.get("checkpoint_at", "")),
        checkpoint_every=seconds(alert, "checkpoint_every"),
        slowdown=slowdown(alert),
        slow_for=seconds(alert, "slow_for"),
        unmatched=unmatched,
    )
